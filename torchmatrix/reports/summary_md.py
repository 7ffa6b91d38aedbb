"""summary.md: the GitHub-flavoured markdown page a person pastes into the PR that bumps torch.

The verdict of each bump first (regressions, checkpoint directions, slowdowns, warnings that
changed), then totals per torch version and per checkpoint direction, the grid of cells x versions
(one mark per suite) and directions (one mark per cell), the failures with their first lines, then
the upgrade diff. Test-provided text only ever appears inside code spans
or fenced blocks sized to the text, so no name or message can turn into markup or HTML.
"""

from __future__ import annotations

import math
import re

from torchmatrix.reports.bump_verdict import BAD, GOOD, WARN, bump_verdict
from torchmatrix.reports.checkpoint_directions import Direction, relative_to_run
from torchmatrix.reports.records import RootCause, RunResults, TestRecord
from torchmatrix.reports.reproducible import is_reproducible, repro_command
from torchmatrix.reports.summary_data import (
    DIRECTIONS_NOTE,
    LIMITS_NOTE,
    Summary,
    distinct_texts,
    other_cells,
    read_label,
    summarize,
)
from torchmatrix.reports.untrusted_text import one_line, visible
from torchmatrix.reports.upgrade_diff import SLOWDOWN_RULE, UpgradeDiff
from torchmatrix.reports.warning_changes import COUNT_FACTOR
from torchmatrix.status import NOT_RUN, ORDER_DEPENDENT, PARTLY_SKIPPED, Confirmation, Status, count

MAX_ROOT_CAUSES = 30
MAX_FAILURES_PER_CAUSE = 12
ROOT_CAUSE_CHARS = 300
MAX_DIFF_ROWS = 30
FAILURE_TEXT_LINES = 40
RANK_TRACEBACK = re.compile(r"^-+ rank \d+ traceback -+$")
MAX_CELLS_NAMED = 12
MAX_TEXTS_PER_CAUSE = 3


def render(results: RunResults, diffs: list[UpgradeDiff]) -> str:
    """The whole page."""
    summary = summarize(results)
    sections = [
        _header(summary),
        *(verdict_section(diff) for diff in diffs),
        _totals(summary),
        _grid(results, summary, [d for diff in diffs for d in diff.checkpoints]),
        _failures(summary),
        _limits(summary),
        _skips(summary),
        *(diff_section(diff) for diff in diffs),
    ]
    return "\n\n".join(section for section in sections if section) + "\n"


VERDICT_MARKS = {BAD: "❌", WARN: "⚠️", GOOD: "✅"}


def verdict_section(diff: UpgradeDiff) -> str:
    """The verdict of one bump, a line per statement, root causes whole in code spans."""
    lines = []
    for line in bump_verdict(diff):
        mark = VERDICT_MARKS[line.level]
        quoted = "".join(f"\n  - {code(text, table=False)}" for text in line.quoted)
        lines.append(f"- {mark} {line.says}{quoted}")
    return f"### Verdict {code(diff.before)} → {code(diff.after)}\n\n" + "\n".join(lines)


def diff_section(diff: UpgradeDiff) -> str:
    """The upgrade diff of one baseline/candidate pair, as a markdown section of its own."""
    before, after = code(diff.before), code(diff.after)
    counts = (
        f"{count(diff.regression_count, 'regression')}"
        + (f" ({count(len(diff.broken_directions), 'checkpoint direction')})" if diff.broken_directions else "")
        + f", {count(len(diff.fixes), 'fix', 'fixes')} (confirmed: "
        f"the failure fails alone), {len(diff.unconfirmed)} unconfirmed, {len(diff.newly_skipped)} newly skipped, "
        f"{count(len(diff.drift), 'drift figure')} grown more than {diff.settings.drift_ratio:g}×, "
        f"{count(len(diff.slowdowns), 'suite')} slower than {diff.settings.slowdown_ratio:g}×, "
        f"{count(len(diff.new_warnings), 'new warning')}, {len(diff.gone_warnings)} gone, "
        f"{len(diff.changed_warnings)} raised more or less often than {COUNT_FACTOR:g}× per test "
        f"({diff.compared} tests compared"
        + (f"; {diff.only_before} only in {before}" if diff.only_before else "")
        + (f"; {diff.only_after} only in {after}" if diff.only_after else "")
        + (f"; {diff.load_note}" if diff.load_note else "")
        + ")"
    )
    parts = [f"### Upgrade diff {before} → {after}", ("**" + counts + "**") if diff.regression_count else counts]
    if diff.builds:
        parts.append(f"⚠️ {diff.builds.note}")
    if diff.checkpoints:
        parts.append(checkpoints_section(diff.checkpoints))
    for title, groups in (
        (f"New warnings on {after}", diff.new_warnings),
        (f"Warnings gone on {after}", diff.gone_warnings),
    ):
        if groups:
            rows = [
                [code(g.category), code(g.module), code(one_line(g.message)), str(g.count), ", ".join(code(t) for t in g.tests[:MAX_CELLS_NAMED]) + (f" and {len(g.tests) - MAX_CELLS_NAMED} more" if len(g.tests) > MAX_CELLS_NAMED else ""), cell_list(list(g.cells))]
                for g in groups
            ]  # fmt: skip
            parts.append(
                f"#### {title} ({count(len(groups), 'warning')}; deprecations first)\n\n"
                + _table(["category", "raised in", "message", "count", "tests", "cells"], rows, MAX_DIFF_ROWS)
            )
    if diff.changed_warnings:
        rows = [
            [code(c.after.category), code(c.after.module), code(one_line(c.after.message)), f"{c.before.count:,} ({c.per_test_before:,.2f} per test)", f"{c.after.count:,} ({c.per_test_after:,.2f} per test)", _ratio(c.ratio)]
            for c in diff.changed_warnings
        ]  # fmt: skip
        parts.append(
            f"#### Warnings raised more or less often than {COUNT_FACTOR:g}× per test on {after} "
            f"({count(len(rows), 'warning')}; deprecations first)\n\n"
            + _table(["category", "raised in", "message", before, after, "× per test"], rows, MAX_DIFF_ROWS)
        )
    for title, changes in (
        ("Regressions (passed → failed or error, fails alone)", diff.regressions),
        ("Fixes (failed or error, and failed alone → passed)", diff.fixes),
        ("Unconfirmed changes (the failing side passed alone, or was not re-run)", diff.unconfirmed),
    ):
        if changes:
            rows = [
                [code(c.after.suite), code(c.after.test), _cells(c.after.run_cell, c.cells), c.before.status, c.after.status, _confirmation(c.failing.confirmation), code(one_line(c.failing.message))]
                for c in changes
            ]  # fmt: skip
            parts.append(
                f"#### {title}\n\n"
                + _table(["suite", "test", "cell", before, after, "alone", "root cause"], rows, MAX_DIFF_ROWS)
            )
    if diff.newly_skipped:
        rows = [
            [code(c.after.suite), code(c.after.test), _cells(c.after.run_cell, c.cells), c.before.status, c.after.status, code(one_line(c.after.message))]
            for c in diff.newly_skipped
        ]  # fmt: skip
        parts.append(
            "#### Newly skipped\n\n" + _table(["suite", "test", "cell", before, after, "reason"], rows, MAX_DIFF_ROWS)
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
            [code(s.suite), s.measure, f"{s.before:.1f} s", f"{s.after:.1f} s", _ratio(s.after / s.before if s.before else math.inf), _ratio(s.median_ratio), f"{s.wall_before:.1f} s → {s.wall_after:.1f} s", str(s.tests)]
            for s in diff.slowdowns
        ]  # fmt: skip
        load = f" {diff.load_note[0].upper()}{diff.load_note[1:]}." if diff.load_note else ""
        parts.append(
            f"#### Suites slower than {diff.settings.slowdown_ratio:g}×\n\n{SLOWDOWN_RULE}{load}\n\n"
            + _table(["suite", "measure", before, after, "×", "median test ×", "wall", "tests timed"], rows)
        )
    return "\n\n".join(parts)


def checkpoints_section(directions: list[Direction]) -> str:
    """Rollback and forward: one line each, then a row per root cause or reason with its cells."""
    lines, rows = [], []
    for d in directions:
        mark = "❌" if d.broken else ("✅" if d.passed and not d.not_checked else "⚠️")
        counted = f"{count(len(d.passed), 'cell')} exact" + (
            f", {count(sum(map(len, d.failed.values())), 'cell')} failed" if d.failed else ""
        )
        counted += f", {count(sum(map(len, d.not_checked.values())), 'cell')} not checked" if d.not_checked else ""
        first = f" — {code(next(iter(d.failed)), table=False)}" if d.failed else ""
        caused = f", caused by {d.candidate}'s {d.changed}" if d.broken else ""
        lines.append(f"- {mark} **{d.name}**: {d.verdict}{caused}{first} ({counted})")
        rows += [[d.name, "failed", code(cause), cell_list(list(cells))] for cause, cells in d.failed.items()]
        rows += [[d.name, "not checked", code(why), cell_list(list(cells))] for why, cells in d.not_checked.items()]
    table = (
        "\n\n" + _table(["direction", "result", "root cause or reason", "cells"], rows, MAX_DIFF_ROWS) if rows else ""
    )
    return "#### Checkpoints across versions (rollback, forward)\n\n" + "\n".join(lines) + table


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


def _header(summary: Summary) -> str:
    versions = ", ".join(code(v.torch) for v in summary.versions)
    started = f"started {code(summary.started)} on {code(summary.hosts)}; " if summary.started else ""
    filtered = [f"torch {code(v.torch)}: {code(v.filters)}" for v in summary.filtered]
    return (
        f"## torchmatrix run {code(summary.run_id)}\n\n"
        f"torch {versions}; baseline {code(summary.baseline)}; {started}"
        f"matrix sha256 {code(summary.matrix_sha256)}"
        + (f"\n\n**Filtered run**, not the whole matrix: {'; '.join(filtered)}" if filtered else "")
    )


def _totals(summary: Summary) -> str:
    rows = []
    for v in [*summary.versions, *summary.directions]:
        missing = f" ({v.missing} missing)" if v.missing else ""
        rows.append(
            [code(v.torch), code(v.build), code(v.device), f"{v.cells}{missing}"]
            + [str(v.counts[s]) for s in Status]
            + [str(n) for _, n in v.confirmations.columns]
        )
    confirmations = [name for name, _ in summary.confirmations.columns]
    table = _table(["torch", "build", "device", "cells", *(s.column for s in Status), *confirmations], rows)
    if not summary.compiled:
        return table
    times = "; ".join(
        f"{code(v.torch, table=False)}: {v.compile_seconds:.0f} s of {v.test_seconds:.0f} s of tests"
        for v in summary.compiled
    )
    return f"{table}\n\nCompile time: {times} ({summary.compile_note})."


def _grid(results: RunResults, summary: Summary, directions: list[Direction]) -> str:
    suites = results.suites
    statuses = results.statuses()
    order_dependent = results.order_dependent()
    partly_skipped = results.partly_skipped()

    def mark(key: tuple[str, str, str]) -> str:
        if key in order_dependent:
            return ORDER_DEPENDENT.emoji
        if key in partly_skipped:
            return PARTLY_SKIPPED.emoji
        return statuses[key].mark.emoji if key in statuses else NOT_RUN.emoji

    marks = [
        f"{Status.PASSED.mark.emoji} all passed",
        f"{PARTLY_SKIPPED.emoji} passed with some tests skipped (see Skipped)",
    ]
    marks += [f"{status.mark.emoji} {status}" for status in Status if status is not Status.PASSED]
    marks.append(f"{ORDER_DEPENDENT.emoji} failed in the run but passed alone (order-dependent or flaky)")
    legend = ", ".join(marks)
    rows = [
        [code(cell)]
        + ["".join(mark((v.torch, cell, s)) for s in suites) for v in results.versions]
        + [_direction_mark(d, cell) for d in directions]
        for cell in results.cells
    ]
    columns = f" {DIRECTIONS_NOTE}" if directions else ""
    return (
        f"### {summary.grid_title}\n\n"
        f"One mark per suite, in this order: {', '.join(code(s, table=False) for s in suites)}. "
        f"{legend}, {NOT_RUN.emoji} not run.{columns}\n\n"
        + _table(["cell", *(code(v.torch) for v in results.versions), *(code(d.label) for d in directions)], rows)
    )


def _direction_mark(direction: Direction, cell: str) -> str:
    status = direction.status_of(cell)
    return status.mark.emoji if status is not None else NOT_RUN.emoji


def _failures(summary: Summary) -> str:
    """Failures grouped by root cause: the line that says what broke, how far it reaches, each
    failing test with the cells it stands for and what re-running it alone showed, and each
    distinct failure text once, with where it occurred."""
    if not summary.root_causes:
        return ""
    return (
        f"### {summary.failures_title}\n\n"
        f"Each root cause is the innermost exception of the first failing rank. {summary.confirmations.note}\n\n"
        + _causes(summary.root_causes, confirmed=True, run_id=summary.run_id, baseline=summary.baseline)
    )


def _limits(summary: Summary) -> str:
    """The tests that hit a CPU-simulation limit, grouped as failures are, each group headed by its
    root cause and the hint that works around it."""
    if not summary.simulation_limits:
        return ""
    return f"### {summary.limits_title}\n\n{LIMITS_NOTE}\n\n" + _causes(
        summary.simulation_limits, confirmed=False, run_id=summary.run_id
    )


def _causes(causes: list[RootCause], confirmed: bool, run_id: str = "", baseline: str = "") -> str:
    """Each cause's line, its reach, its tests (failures with what re-running them alone showed, and
    for a confirmed one the command that writes its standalone reproducer) and its distinct texts."""
    sections = []
    for index, cause in enumerate(causes[:MAX_ROOT_CAUSES], 1):
        versions = "torch " + ", ".join(code(v, False) for v in cause.versions)
        if any(record.reads_writer for record, _ in cause.failures):
            versions = ", ".join(dict.fromkeys(_ran_by(record, baseline) for record, _ in cause.failures))
        items = []
        for record, cells in cause.failures[:MAX_FAILURES_PER_CAUSE]:
            others = other_cells(record.run_cell, cells)
            shared = f" (its result stands for {cell_list(others, MAX_CELLS_NAMED)})" if others else ""
            alone = f" · {_confirmation(record.confirmation)}" if confirmed else ""
            repro = (
                f" · reproduce: {code(repro_command(run_id, record), False)}"
                if confirmed and is_reproducible(record)
                else ""
            )
            items.append(
                f"- {record.status} · {_ran_by(record, baseline)} · {code(record.suite, False)} "
                f"{code(record.test, False)} in {code(record.run_cell, False)}{shared}{alone}{repro}"
            )
        more = len(cause.failures) - MAX_FAILURES_PER_CAUSE
        if more > 0:
            items.append(f"- … and {more} more in summary.html and results.json")
        texts = distinct_texts(cause)
        left_out = len(texts) - MAX_TEXTS_PER_CAUSE
        more_texts = (
            f"\n\n… and {count(left_out, 'more distinct text')} of this cause in summary.html." if left_out > 0 else ""
        )
        sections.append(
            f"#### {index}. {code(one_line(relative_to_run(cause.line, run_id), ROOT_CAUSE_CHARS), False)}\n\n"
            f"{count(cause.tests, 'test')} in {count(len(cause.cells), 'cell')}, {versions}\n\n"
            + "\n".join(items)
            + "".join(f"\n\n{_text_once(where, run_id)}" for where in texts[:MAX_TEXTS_PER_CAUSE])
            + more_texts
        )
    more = len(causes) - MAX_ROOT_CAUSES
    tail = f"\n\n… and {count(more, 'more root cause')} in summary.html and results.json." if more > 0 else ""
    return "\n\n".join(sections) + tail


def _ran_by(record: TestRecord, baseline: str) -> str:
    """`torch 2.13.0`, or for a read of another version's checkpoint the direction it belongs to."""
    label = read_label(record, baseline)
    return code(label, False) if label else f"torch {code(record.torch, False)}"


def where(record: TestRecord) -> str:
    return f"{code(record.test, False)} in {code(record.run_cell, False)} (torch {code(record.torch, False)})"


def _text_once(records: list[TestRecord], run_id: str) -> str:
    """One failure text, a click away, with every failure that printed exactly it."""
    first = records[0]
    places = "; ".join(where(record) for record in records[:MAX_CELLS_NAMED])
    more = f" and {len(records) - MAX_CELLS_NAMED} more" if len(records) > MAX_CELLS_NAMED else ""
    label = f"Text of {places}{more}:" if len(records) == 1 else f"The same text in {len(records)}: {places}{more}:"
    return (
        f"{label}\n\n<details><summary>show the text</summary>\n\n"
        f"{fenced(excerpt(relative_to_run(first.text or first.message, run_id)))}\n\n</details>"
    )


def _skips(summary: Summary) -> str:
    """Why tests were skipped: one row per reason with how many tests, which torch versions and cells."""
    reasons = summary.skip_reasons
    if not reasons:
        return ""
    rows = [
        [
            code(one_line(reason.line, ROOT_CAUSE_CHARS)),
            str(len(reason.records)),
            ", ".join(code(v) for v in reason.versions),
            cell_list(reason.cells),
        ]
        for reason in reasons
    ]
    return f"### {summary.skipped_title}\n\n" + _table(["reason", "tests", "torch", "cells"], rows)


def cell_list(cells: list[str], limit: int = MAX_CELLS_NAMED) -> str:
    """Cells by name, the first ``limit`` of them, then how many more."""
    named = ", ".join(code(cell) for cell in cells[:limit])
    return named + (f" and {len(cells) - limit} more" if len(cells) > limit else "")


def excerpt(text: str) -> str:
    """What a reader needs of a failure's text: the first failing rank's traceback when there is one
    (the pytest frames before it only say which test called ranks.run), else the text's end."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if RANK_TRACEBACK.match(line)), None)
    if start is not None:
        return "\n".join(lines[start : start + FAILURE_TEXT_LINES])
    return "\n".join(lines[-FAILURE_TEXT_LINES:])


def _confirmation(value: str) -> str:
    description = Confirmation.describe(value)
    return f"{ORDER_DEPENDENT.emoji} {description}" if value == Confirmation.PASSED_ALONE else description


def _cells(cell: str, cells: tuple[str, ...]) -> str:
    """The cell that ran a test, and by name the cells its result stands for."""
    others = other_cells(cell, cells)
    return code(cell) + (f" (also {cell_list(others)})" if others else "")


def _table(header: list[str], rows: list[list[str]], limit: int | None = None) -> str:
    shown = rows[:limit]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in shown]
    if len(shown) < len(rows):
        lines.append(f"\n… and {len(rows) - len(shown)} more rows in results.json.")
    return "\n".join(lines)


def _number(value: float) -> str:
    return f"{value:.3g}"


def _ratio(value: float) -> str:
    return f"{value:.1f}×"
