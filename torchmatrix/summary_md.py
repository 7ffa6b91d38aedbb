"""summary.md: the GitHub-flavoured markdown page a person pastes into the PR that bumps torch.

Totals per torch version, the grid of cells x versions (one mark per suite), the failures with
their first lines, then the upgrade diff. Test-provided text only ever appears inside code spans
or fenced blocks sized to the text, so no name or message can turn into markup or HTML.
"""

from __future__ import annotations

import math
import re

from torchmatrix.results import RunResults
from torchmatrix.untrusted_text import one_line, visible
from torchmatrix.upgrade_diff import UpgradeDiff

MARKS = {"passed": "✅", "failed": "❌", "error": "💥", "skipped": "⏭️"}
NOT_RUN = "·"
MAX_FAILURES = 50
MAX_DIFF_ROWS = 30
FAILURE_TEXT_LINES = 8


def render(results: RunResults, diffs: list[UpgradeDiff]) -> str:
    """The whole page."""
    sections = [
        _header(results),
        _totals(results),
        _grid(results),
        _failures(results),
        *(diff_section(diff) for diff in diffs),
    ]
    return "\n\n".join(section for section in sections if section) + "\n"


def diff_section(diff: UpgradeDiff) -> str:
    """The upgrade diff of one baseline/candidate pair, as a markdown section of its own."""
    before, after = code(diff.before), code(diff.after)
    counts = (
        f"{_count(len(diff.regressions), 'regression')}, {_count(len(diff.fixes), 'fix', 'fixes')}, "
        f"{len(diff.newly_skipped)} newly skipped, "
        f"{_count(len(diff.drift), 'drift figure')} grown more than {diff.settings.drift_ratio:g}×, "
        f"{_count(len(diff.slowdowns), 'suite')} slower than {diff.settings.slowdown_ratio:g}× "
        f"({diff.compared} tests compared"
        + (f"; {diff.only_before} only in {before}" if diff.only_before else "")
        + (f"; {diff.only_after} only in {after}" if diff.only_after else "")
        + ")"
    )
    parts = [f"### Upgrade diff {before} → {after}", ("**" + counts + "**") if diff.regressions else counts]
    for title, changes in (
        ("Regressions (passed → failed or error)", diff.regressions),
        ("Fixes (failed or error → passed)", diff.fixes),
        ("Newly skipped", diff.newly_skipped),
    ):
        if changes:
            rows = [
                [code(c.after.suite), code(c.after.test), _cells(c.after.run_cell, c.cells), c.before.status, c.after.status, code(one_line(c.after.message or c.before.message))]
                for c in changes
            ]  # fmt: skip
            parts.append(
                f"#### {title}\n\n" + _table(["suite", "test", "cell", before, after, "message"], rows, MAX_DIFF_ROWS)
            )
    if diff.drift:
        rows = [
            [code(d.suite), code(d.test), code(d.cell), code(d.figure), _number(d.before), _number(d.after), d.growth, str(grown)]
            for d, grown in diff.drift_by_measure()
        ]  # fmt: skip
        parts.append(
            f"#### Drift grown more than {diff.settings.drift_ratio:g}×\n\nPer measure, the figure that grew most; "
            "every grown figure is in results.json.\n\n"
            + _table(["suite", "test", "cell", "figure", before, after, "×", "figures grown"], rows, MAX_DIFF_ROWS)
        )
    if diff.slowdowns:
        rows = [
            [code(s.suite), f"{s.before:.1f} s", f"{s.after:.1f} s", _ratio(s.after / s.before if s.before else math.inf), str(s.tests)]
            for s in diff.slowdowns
        ]  # fmt: skip
        parts.append(
            f"#### Suites slower than {diff.settings.slowdown_ratio:g}×\n\n"
            + _table(["suite", before, after, "×", "tests timed"], rows)
        )
    return "\n\n".join(parts)


def code(text: object, table: bool = True) -> str:
    """`text` as one code span: markdown and HTML inside it stay literal; pipes are escaped for tables."""
    line = visible(" ".join(str(text).split())) if str(text).strip() else ""
    if not line:
        return ""
    if table:
        line = line.replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall("`+", line)), default=0) + 1)
    pad = " " if line.startswith("`") or line.endswith("`") else ""
    return f"{fence}{pad}{line}{pad}{fence}"


def fenced(text: str) -> str:
    """`text` as a fenced code block whose fence is longer than any backtick run inside it."""
    body = visible(text)
    fence = "`" * max(3, max((len(run) for run in re.findall("`+", body)), default=0) + 1)
    return f"{fence}text\n{body}\n{fence}"


def _header(results: RunResults) -> str:
    versions = ", ".join(code(v.torch) for v in results.versions)
    started = f"started {code(results.created)} on {code(', '.join(results.hosts))}; " if results.created else ""
    return (
        f"## torchmatrix run {code(results.run_id)}\n\n"
        f"torch {versions}; baseline {code(results.baseline)}; {started}"
        f"matrix sha256 {code(results.matrix_sha256[:12])}"
    )


def _totals(results: RunResults) -> str:
    rows = []
    for v in results.versions:
        totals = results.totals(v.torch)
        cells = len({r.cell for r in results.records(v.torch)})
        missing = f" ({len(v.missing_cells)} missing)" if v.missing_cells else ""
        rows.append(
            [code(v.torch), code(v.build), code(v.device), f"{cells}{missing}"]
            + [str(totals[s]) for s in ("passed", "failed", "error", "skipped")]
        )
    return _table(["torch", "build", "device", "cells", "passed", "failed", "errors", "skipped"], rows)


def _grid(results: RunResults) -> str:
    suites = results.suites
    statuses = results.statuses()
    legend = ", ".join(f"{mark} {status}" for status, mark in MARKS.items())
    rows = [
        [code(cell)] + ["".join(MARKS.get(statuses.get((v.torch, cell, s)), NOT_RUN) for s in suites) for v in results.versions]
        for cell in results.cells
    ]  # fmt: skip
    return (
        f"### Grid: {_count(len(results.cells), 'cell')} × {_count(len(results.versions), 'torch version')}\n\n"
        f"One mark per suite, in this order: {', '.join(code(s, table=False) for s in suites)}. "
        f"{legend}, {NOT_RUN} not run.\n\n" + _table(["cell", *(code(v.torch) for v in results.versions)], rows)
    )


def _failures(results: RunResults) -> str:
    failures = results.failures()
    if not failures:
        return ""
    items = []
    for record, cells in failures[:MAX_FAILURES]:
        shared = f" (and {len(cells) - 1} more cells)" if len(cells) > 1 else ""
        headline = (
            f"- {record.status} · torch {code(record.torch, False)} · {code(record.suite, False)} "
            f"{code(record.test, False)} in {code(record.run_cell, False)}{shared}: "
            f"{code(one_line(record.message), False) or '(no message)'}"
        )
        lines = record.text.splitlines()[:FAILURE_TEXT_LINES]
        block = "\n".join("  " + line for line in fenced("\n".join(lines)).splitlines()) if lines else ""
        items.append(headline + ("\n\n" + block if block else ""))
    more = len(failures) - MAX_FAILURES
    tail = f"\n\n… and {more} more in summary.html and results.json." if more > 0 else ""
    return f"### Failures ({len(failures)})\n\n" + "\n\n".join(items) + tail


def _cells(cell: str, cells: tuple[str, ...]) -> str:
    return code(cell) + (f" +{len(cells) - 1}" if len(cells) > 1 else "")


def _table(header: list[str], rows: list[list[str]], limit: int | None = None) -> str:
    shown = rows[:limit]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in shown]
    if len(shown) < len(rows):
        lines.append(f"\n… and {len(rows) - len(shown)} more rows in results.json.")
    return "\n".join(lines)


def _count(n: int, singular: str, plural: str | None = None) -> str:
    return f"{n} {singular if n == 1 else plural or singular + 's'}"


def _number(value: float) -> str:
    return f"{value:.3g}"


def _ratio(value: float) -> str:
    return f"{value:.1f}×"
