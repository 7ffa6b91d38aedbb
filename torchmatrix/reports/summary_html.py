"""summary.html: one self-contained page (no network) to read a run and its torch-upgrade diff.

The grid of cells x torch versions has one coloured mark per suite and filters by axis value;
every failure expands to its full text; drift figures get a small inline SVG bar chart across
torch versions. All test-provided text goes through `html.escape`, and a Content-Security-Policy
allows only this page's own script (by hash), so injected markup could neither load nor run.
"""

from __future__ import annotations

import base64
import hashlib
import html
import math
from collections import defaultdict

from torchmatrix.reports.bump_verdict import bump_verdict
from torchmatrix.reports.checkpoint_directions import Direction, relative_to_run
from torchmatrix.reports.records import RootCause, RunResults, TestRecord, drift_measure, is_drift_figure
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
from torchmatrix.reports.upgrade_diff import SLOWDOWN_RULE, Change, UpgradeDiff, grew
from torchmatrix.reports.warning_changes import COUNT_FACTOR
from torchmatrix.status import NOT_RUN, ORDER_DEPENDENT, PARTLY_SKIPPED, Confirmation, Mark, Status, count

CHART_BAR = 14
CHART_HEIGHT = 28
CONFIRMED_STYLE = {"fail alone": "bad", "passed alone": "warn", "unconfirmed": "bad"}

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em; color: #1f2328; }
code, pre { font-family: ui-monospace, monospace; font-size: 12.5px; }
pre { background: #f6f8fa; padding: .6em; overflow-x: auto; white-space: pre-wrap; }
table { border-collapse: collapse; margin: .5em 0 1.2em; }
th, td { border: 1px solid #d0d7de; padding: .2em .5em; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
.mark { display: inline-block; width: 1.4em; text-align: center; border-radius: 3px; margin-right: 2px;
        color: #fff; text-decoration: none; font-weight: bold; }
.passed { background: #1a7f37; } .failed { background: #cf222e; } .error { background: #8250df; }
.skipped { background: #8c959f; } .none { background: #eaeef2; color: #57606a; }
.order-dependent { background: #bf8700; } .simulation-limit { background: #1b7c83; }
.partly-skipped { background: #fff; color: #1a7f37; box-shadow: inset 0 0 0 2px #1a7f37; }
.bad { color: #cf222e; font-weight: bold; } .good { color: #1a7f37; } .warn { color: #9a6700; font-weight: bold; }
details.failure { margin: .3em 0; } details.failure summary { cursor: pointer; }
details.cells { display: inline; } details.cells summary { display: inline; cursor: pointer; color: #0969da; }
#filters label { margin-right: 1em; } #filters select { margin-left: .3em; }
svg rect.base { fill: #8c959f; } svg rect.same { fill: #0969da; } svg rect.grown { fill: #cf222e; }
svg rect.zero { fill: #d0d7de; }
"""

SCRIPT = """
"use strict";
const selects = Array.from(document.querySelectorAll("#filters select"));
const rows = Array.from(document.querySelectorAll("tr.cell-row"));
function applyFilters() {
  let shown = 0;
  for (const row of rows) {
    const values = row.dataset.values.split(" ");
    const keep = selects.every((s) => s.value === "" || values[Number(s.dataset.axis)] === s.value);
    row.hidden = !keep;
    if (keep) shown += 1;
  }
  document.getElementById("shown").textContent = shown + " of " + rows.length + " cells shown";
}
for (const select of selects) select.addEventListener("change", applyFilters);
function openTarget() {
  const target = location.hash ? document.getElementById(location.hash.slice(1)) : null;
  if (target && target.tagName === "DETAILS") target.open = true;
}
window.addEventListener("hashchange", openTarget);
openTarget();
applyFilters();
"""


def render(results: RunResults, diffs: list[UpgradeDiff]) -> str:
    """The whole page as one string."""
    summary = summarize(results)
    anchors = {
        (r.torch, r.suite, r.test, r.run_cell): f"{kind}-{c}-{t}"
        for kind, causes in (("failure", summary.root_causes), ("limit", summary.simulation_limits))
        for c, cause in enumerate(causes)
        for t, records in enumerate(distinct_texts(cause))
        for r in records
    }
    body = "\n".join(
        [
            _header(summary),
            *(_verdict(diff) for diff in diffs),
            _totals(summary),
            *(_diff(diff) for diff in diffs),
            _grid(results, summary, anchors, [d for diff in diffs for d in diff.checkpoints]),
            _failures(summary, anchors),
            _limits(summary, anchors),
            _skips(summary),
            _drift(results),
        ]
    )
    script_hash = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    policy = f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{script_hash}'"
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{policy}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>torchmatrix run {text(results.run_id)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        f"{body}\n<script>{SCRIPT}</script>\n</body>\n</html>\n"
    )


def text(value: object) -> str:
    """Untrusted text made safe for HTML content and attribute values."""
    return html.escape(visible(str(value)), quote=True)


def _header(summary: Summary) -> str:
    versions = ", ".join(
        f"<code>{text(v.torch)}</code> ({text(v.build or 'build unknown')}, {text(v.device or 'device unknown')})"
        for v in summary.versions
    )
    started = f"Started {text(summary.started)} on {text(summary.hosts)}; " if summary.started else ""
    filtered = "; ".join(
        f"torch <code>{text(v.torch)}</code>: <code>{text(v.filters)}</code>" for v in summary.filtered
    )
    return (
        f"<h1>torchmatrix run <code>{text(summary.run_id)}</code></h1>\n"
        + (f'<p class="bad">Filtered run, not the whole matrix: {filtered}</p>\n' if filtered else "")
        + f"<p>torch {versions}; baseline <code>{text(summary.baseline)}</code>. {started}"
        f"matrix <code>{text(summary.matrix_path)}</code> sha256 <code>{text(summary.matrix_sha256)}</code>.</p>"
    )


def _verdict(diff: UpgradeDiff) -> str:
    """The verdict of one bump, a line per statement, root causes whole."""
    items = "".join(
        f'<li class="{line.level}" data-topic="{text(line.topic)}">{text(line.says)}'
        + (
            "<ul>" + "".join(f"<li><code>{text(quoted)}</code></li>" for quoted in line.quoted) + "</ul>"
            if line.quoted
            else ""
        )
        + "</li>"
        for line in bump_verdict(diff)
    )
    return (
        f'<h2 class="verdict">Verdict <code>{text(diff.before)}</code> → <code>{text(diff.after)}</code></h2>\n'
        f'<ul class="verdict">{items}</ul>'
    )


def _totals(summary: Summary) -> str:
    """Tests per status, then what re-running the failing ones alone showed: only a failure that
    fails alone, or that nobody confirmed, is red; one that passed alone is order-dependent."""
    rows = []
    for v in [*summary.versions, *summary.directions]:
        missing = f' <span class="bad">{v.missing} missing</span>' if v.missing else ""
        rows.append(
            f"<tr><th><code>{text(v.torch)}</code></th><td>{v.cells}{missing}</td>"
            + "".join(f"<td>{v.counts[s]}</td>" for s in Status)
            + "".join(_confirmed_count(name, n) for name, n in v.confirmations.columns)
            + "</tr>"
        )
    confirmations = "".join(f"<th>{name}</th>" for name, _ in summary.confirmations.columns)
    times = "; ".join(
        f"<code>{text(v.torch)}</code>: {v.compile_seconds:.0f} s of {v.test_seconds:.0f} s of tests"
        for v in summary.compiled
    )
    compile_note = f'\n<p id="compile-time">Compile time: {times} ({text(summary.compile_note)}).</p>' if times else ""
    return (
        '<h2>Totals</h2>\n<table id="totals"><tr><th>torch</th><th>cells</th>'
        f"{''.join(f'<th>{s.column}</th>' for s in Status)}{confirmations}</tr>\n{''.join(rows)}</table>" + compile_note
    )


def _confirmed_count(column: str, n: int) -> str:
    """A totals count of what failures did alone; red for real or unconfirmed ones, amber for order-dependent ones."""
    return f'<td class="{CONFIRMED_STYLE[column]}">{n}</td>' if n else "<td>0</td>"


def _diff(diff: UpgradeDiff) -> str:
    before, after = text(diff.before), text(diff.after)
    summary = (
        f'<p><span class="{"bad" if diff.regression_count else "good"}">{count(diff.regression_count, "regression")}'
        + (f" ({count(len(diff.broken_directions), 'checkpoint direction')})" if diff.broken_directions else "")
        + "</span>, "
        f"{count(len(diff.fixes), 'fix', 'fixes')} (confirmed: the failure fails alone), "
        f"{len(diff.unconfirmed)} unconfirmed, {len(diff.newly_skipped)} newly skipped, "
        f"{count(len(diff.drift), 'drift figure')} grown more than {diff.settings.drift_ratio:g}×, "
        f"{count(len(diff.slowdowns), 'suite')} slower than {diff.settings.slowdown_ratio:g}×, "
        f"{count(len(diff.new_warnings), 'new warning')}, {len(diff.gone_warnings)} gone, "
        f"{len(diff.changed_warnings)} raised more or less often than {COUNT_FACTOR:g}× per test "
        f"({diff.compared} tests compared{'; ' + text(diff.load_note) if diff.load_note else ''}).</p>"
    )
    parts = [f'<h2 class="upgrade">Upgrade diff <code>{before}</code> → <code>{after}</code></h2>', summary]
    if diff.builds:
        parts.append(f'<p class="warn builds">{text(diff.builds.note)}</p>')
    if diff.checkpoints:
        parts.append(_checkpoints(diff.checkpoints))
    for title, groups in (
        (f"New warnings on <code>{after}</code>", diff.new_warnings),
        (f"Warnings gone on <code>{after}</code>", diff.gone_warnings),
    ):
        if groups:
            rows = "".join(
                f"<tr><td><code>{text(g.category)}</code></td><td><code>{text(g.module)}</code></td>"
                f"<td><code>{text(g.message)}</code></td><td>{g.count}</td>"
                f"<td>{', '.join(f'<code>{text(t)}</code>' for t in g.tests)}</td>"
                f"<td>{', '.join(f'<code>{text(c)}</code>' for c in g.cells)}</td></tr>"
                for g in groups
            )
            parts.append(
                f"<h3>{title} ({count(len(groups), 'warning')}; deprecations first)</h3>\n<table><tr><th>category</th>"
                f"<th>raised in</th><th>message</th><th>count</th><th>tests</th><th>cells</th></tr>{rows}</table>"
            )
    if diff.changed_warnings:
        rows = "".join(
            f"<tr><td><code>{text(c.after.category)}</code></td><td><code>{text(c.after.module)}</code></td>"
            f"<td><code>{text(c.after.message)}</code></td><td>{c.before.count:,} ({c.per_test_before:,.2f} per test)</td>"
            f"<td>{c.after.count:,} ({c.per_test_after:,.2f} per test)</td><td>{c.ratio:.2f}×</td></tr>"
            for c in diff.changed_warnings
        )
        parts.append(
            f"<h3>Warnings raised more or less often than {COUNT_FACTOR:g}× per test on <code>{after}</code> "
            f"({count(len(diff.changed_warnings), 'warning')}; deprecations first)</h3>\n<table><tr><th>category</th>"
            f"<th>raised in</th><th>message</th><th>{before}</th><th>{after}</th><th>× per test</th></tr>{rows}</table>"
        )
    for title, changes in (
        ("Regressions (fail alone)", diff.regressions),
        ("Fixes (the baseline's failure failed alone)", diff.fixes),
        ("Unconfirmed changes (the failing side passed alone, or was not re-run)", diff.unconfirmed),
        ("Newly skipped", diff.newly_skipped),
    ):
        if changes:
            parts.append(
                f"<h3>{title}</h3>\n" + _changes_table(changes, before, after, changes is not diff.newly_skipped)
            )
    if diff.drift:
        rows = "".join(
            f"<tr><td><code>{text(d.suite)}</code></td><td><code>{text(d.test)}</code></td>"
            f"<td><code>{text(d.cell)}</code></td><td><code>{text(d.figure)}</code></td>"
            f"<td>{d.before:.3g}</td><td>{d.after:.3g}</td><td>{text(d.growth)}</td><td>{grown}</td></tr>"
            for d, grown in diff.drift_by_measure()
        )
        parts.append(
            f"<h3>Drift grown more than {diff.settings.drift_ratio:g}×</h3>\n<p>Per measure, the figure that grew most; "
            "every grown figure is in results.json.</p>\n<table><tr><th>suite</th><th>test</th><th>cell</th>"
            f"<th>figure</th><th>{before}</th><th>{after}</th><th>×</th><th>figures grown</th></tr>{rows}</table>"
        )
    if diff.slowdowns:
        rows = "".join(
            f"<tr><td><code>{text(s.suite)}</code></td><td>{s.measure}</td><td>{s.before:.1f} s</td><td>{s.after:.1f} s</td>"
            f"<td>{s.median_ratio:.1f}×</td><td>{s.tests}</td></tr>"
            for s in diff.slowdowns
        )
        parts.append(
            f"<h3>Suites slower than {diff.settings.slowdown_ratio:g}×</h3>\n<p>{text(SLOWDOWN_RULE)}</p>\n"
            "<table><tr><th>suite</th><th>measure</th>"
            f"<th>{before}</th><th>{after}</th><th>median test ×</th><th>tests timed</th></tr>{rows}</table>"
        )
    return "\n".join(parts)


def _checkpoints(directions: list[Direction]) -> str:
    """Rollback and forward, each with its verdict, then its root causes and not-checked reasons with their cells."""
    items, rows = [], []
    for d in directions:
        style = "bad" if d.broken else ("good" if d.passed and not d.not_checked else "")
        caused = f", caused by {d.candidate}'s {d.changed}" if d.broken else ""
        items.append(
            f'<li><span class="{style}"><b>{text(d.name)}</b>: {text(d.verdict + caused)}</span> ({len(d.passed)} cells exact)</li>'
        )
        for result, groups in (("failed", d.failed), ("not checked", d.not_checked)):
            rows += [
                f"<tr><td>{text(d.name)}</td><td>{result}</td><td><code>{text(why)}</code></td>"
                f"<td>{', '.join(f'<code>{text(cell)}</code>' for cell in cells)}</td></tr>"
                for why, cells in groups.items()
            ]
    table = (
        "<table><tr><th>direction</th><th>result</th><th>root cause or reason</th><th>cells</th></tr>"
        + "".join(rows)
        + "</table>"
        if rows
        else ""
    )
    return "<h3>Checkpoints across versions (rollback, forward)</h3>\n<ul>" + "".join(items) + "</ul>\n" + table


def _changes_table(changes: list[Change], before: str, after: str, failing: bool) -> str:
    """Status changes; those with a failing side show what it did alone and its root cause, skips their reason."""
    rows = "".join(
        f"<tr><td><code>{text(c.after.suite)}</code></td><td><code>{text(c.after.test)}</code></td>"
        f"<td><code>{text(c.after.run_cell)}</code>{_more_cells(other_cells(c.after.run_cell, c.cells))}</td>"
        f"<td>{_mark(c.before.status.mark)}</td><td>{_mark(c.after.status.mark)}</td>"
        + (
            f"<td>{text(_alone(c))}</td><td>{text(one_line(c.failing.message))}</td></tr>"
            if failing
            else f"<td>{text(one_line(c.after.message))}</td></tr>"
        )
        for c in changes
    )
    last = "<th>alone</th><th>root cause</th>" if failing else "<th>reason</th>"
    return (
        f"<table><tr><th>suite</th><th>test</th><th>cell</th><th>{before}</th><th>{after}</th>{last}</tr>{rows}</table>"
    )


def _alone(change: Change) -> str:
    """What re-running the failing side alone showed."""
    return Confirmation.describe(change.failing.confirmation)


def _mark(mark: Mark, attributes: str = "") -> str:
    """A status mark as the page's coloured badge."""
    return f'<span class="mark {mark.css}"{attributes}>{mark.symbol}</span>'


def _more_cells(others: list[str]) -> str:
    """The other cells a result stands for (summary_data.other_cells), named, collapsed behind their count."""
    if not others:
        return ""
    return f' <details class="cells"><summary>and {count(len(others), "more cell")}</summary>{_cell_names(others)}</details>'


def _cell_names(cells: list[str] | tuple[str, ...]) -> str:
    return ", ".join(f"<code>{text(cell)}</code>" for cell in cells)


def _grid(results: RunResults, summary: Summary, anchors: dict, directions: list[Direction]) -> str:
    axes = results.axes
    value_index = {axis: {value: i for i, value in enumerate(values)} for axis, values in axes.items()}
    filters = "".join(
        f'<label>{text(axis)}<select data-axis="{a}"><option value="">all</option>'
        + "".join(f'<option value="{i}">{text(value)}</option>' for i, value in enumerate(values))
        + "</select></label>"
        for a, (axis, values) in enumerate(axes.items())
    )
    statuses = results.statuses()
    order_dependent = results.order_dependent()
    partly_skipped = results.partly_skipped()
    first_failure = _first_failure_per_suite(results.tests)
    suites = results.suites
    head = "".join(f"<th><code>{text(v.torch)}</code></th>" for v in results.versions)
    head += "".join(f"<th><code>{text(d.label)}</code></th>" for d in directions)
    rows = []
    for cell, values in results.cells.items():
        indices = " ".join(str(value_index[axis].get(values.get(axis), -1)) for axis in axes)
        marks = []
        for v in results.versions:
            cell_marks = []
            for suite in suites:
                status = statuses.get((v.torch, cell, suite))
                title = text(f"{suite}: {status or 'not run'}")
                if status is None:
                    cell_marks.append(_mark(NOT_RUN, f' title="{title}"'))
                    continue
                record = first_failure.get((v.torch, cell, suite))
                anchor = anchors.get((record.torch, record.suite, record.test, record.run_cell)) if record else None
                href = f' href="#{anchor}"' if anchor else ""
                key = (v.torch, cell, suite)
                mark = status.mark
                if key in order_dependent:
                    mark = ORDER_DEPENDENT
                elif key in partly_skipped:
                    mark = PARTLY_SKIPPED
                    skipped, tests = partly_skipped[key]
                    title = text(f"{suite}: passed, {skipped} of {tests} tests skipped")
                    href = ' href="#skipped"'

                cell_marks.append(f'<a class="mark {mark.css}" title="{title}"{href}>{mark.symbol}</a>')
            marks.append(f"<td>{''.join(cell_marks)}</td>")
        for direction in directions:
            status = direction.status_of(cell)
            mark = status.mark if status is not None else NOT_RUN
            title = text(f"{direction.label}: {status or 'not run'}")
            marks.append(
                f'<td class="direction"><span class="mark {mark.css}" title="{title}">{mark.symbol}</span></td>'
            )
        rows.append(
            f'<tr class="cell-row" data-values="{indices}"><th><code>{text(cell)}</code></th>{"".join(marks)}</tr>'
        )
    legend = " ".join(f"{_mark(s.mark)} {'all passed' if s is Status.PASSED else s}" for s in Status)
    legend += f" {_mark(PARTLY_SKIPPED)} passed with some tests skipped"
    legend += f" {_mark(ORDER_DEPENDENT)} failed in the run but passed alone (order-dependent or flaky)"
    return (
        f"<h2>{summary.grid_title}</h2>\n"
        f"<p>One mark per suite, in this order: {', '.join(f'<code>{text(s)}</code>' for s in suites)}. {legend}. "
        "A red or purple mark links to its failure, a teal one to its CPU-simulation limit."
        + (f" {text(DIRECTIONS_NOTE)}" if directions else "")
        + "</p>\n"
        f'<form id="filters">{filters}<span id="shown"></span></form>\n'
        f'<table id="grid"><thead><tr><th>cell</th>{head}</tr></thead><tbody>\n'
        + "\n".join(rows)
        + "\n</tbody></table>"
    )


def _first_failure_per_suite(records: list[TestRecord]) -> dict[tuple[str, str, str], TestRecord]:
    """The test a suite's mark links to: its first failure, else its first CPU-simulation limit."""
    found: dict[tuple[str, str, str], TestRecord] = {}
    for record in sorted(records, key=lambda r: r.status is Status.SIMULATION_LIMIT):
        if record.status.is_failing or record.status is Status.SIMULATION_LIMIT:
            found.setdefault((record.torch, record.cell, record.suite), record)
    return found


def _failures(summary: Summary, anchors: dict) -> str:
    """Failures grouped by root cause; each distinct failure text expands once, with every failing
    test that printed exactly it."""
    if not summary.root_causes:
        return "<h2>Failures</h2>\n<p>None.</p>"
    return (
        f"<h2>{summary.failures_title}</h2>\n"
        f"<p>Each root cause is the innermost exception of the first failing rank. {text(summary.confirmations.note)}</p>\n"
        + _causes(summary.root_causes, anchors, confirmed=True, run_id=summary.run_id, baseline=summary.baseline)
    )


def _limits(summary: Summary, anchors: dict) -> str:
    """The tests that hit a CPU-simulation limit, grouped as failures are, each group headed by its
    root cause and the hint that works around it; nothing when there are none (a GPU run has none)."""
    if not summary.simulation_limits:
        return ""
    return f'<h2 id="simulation-limits">{summary.limits_title}</h2>\n<p>{text(LIMITS_NOTE)}</p>\n' + _causes(
        summary.simulation_limits, anchors, confirmed=False, run_id=summary.run_id
    )


def _causes(causes: list[RootCause], anchors: dict, confirmed: bool, run_id: str = "", baseline: str = "") -> str:
    cells_of = {(r.torch, r.suite, r.test, r.run_cell): cells for cause in causes for r, cells in cause.failures}
    sections = []
    for cause in causes:
        items = []
        for records in distinct_texts(cause):
            first = records[0]
            anchor = anchors[(first.torch, first.suite, first.test, first.run_cell)]
            lines = "".join(
                f"<li>{_failure_line(r, cells_of[(r.torch, r.suite, r.test, r.run_cell)], confirmed, run_id, baseline)}</li>"
                for r in records
            )
            noun = "failing test" if confirmed else "test"
            same = f"the same text in {count(len(records), noun)}" if len(records) > 1 else "the text"
            items.append(
                f'<ul class="where">{lines}</ul>\n<details class="failure" id="{anchor}"><summary>{same}</summary>\n'
                f"<pre>{text(relative_to_run(first.text or first.message, run_id))}</pre></details>"
            )
        versions = "torch " + ", ".join(f"<code>{text(v)}</code>" for v in cause.versions)
        if any(record.reads_writer for record, _ in cause.failures):
            labels = (read_label(record, baseline) or f"torch {record.torch}" for record, _ in cause.failures)
            versions = ", ".join(f"<code>{text(label)}</code>" for label in dict.fromkeys(labels))
        sections.append(
            f'<section class="root-cause"><h3><code>{text(relative_to_run(cause.line, run_id))}</code></h3>\n'
            f"<p>{count(cause.tests, 'test')} in {count(len(cause.cells), 'cell')}, {versions}</p>\n"
            + "\n".join(items)
            + "</section>"
        )
    return "\n".join(sections)


def _failure_line(record: TestRecord, cells: list[str], confirmed: bool, run_id: str = "", baseline: str = "") -> str:
    """One failing test: status, torch, suite, test, the cell that ran it (and those it stands for),
    and for a failure what re-running it alone showed (for a confirmed one, the command that writes
    its standalone reproducer)."""
    flag = ' class="bad"' if record.confirmation == Confirmation.FAILS_ALONE else ""
    alone = f" · <span{flag}>{text(Confirmation.describe(record.confirmation))}</span>" if confirmed else ""
    if confirmed and is_reproducible(record):
        alone += f" · reproduce: <code>{text(repro_command(run_id, record))}</code>"
    direction = read_label(record, baseline)
    ran_by = f"<code>{text(direction)}</code>" if direction else f"torch <code>{text(record.torch)}</code>"
    return (
        f"{_mark(record.status.mark)} {ran_by} · "
        f"<code>{text(record.suite)}</code> <code>{text(record.test)}</code> in <code>{text(record.run_cell)}</code>"
        f"{_more_cells(other_cells(record.run_cell, cells))}{alone}"
    )


def _skips(summary: Summary) -> str:
    """Why tests were skipped: one row per reason, with how many tests, the torch versions and the cells."""
    reasons = summary.skip_reasons
    if not reasons:
        return '<h2 id="skipped">Skipped</h2>\n<p>None.</p>'
    rows = "".join(
        f"<tr><td><code>{text(reason.line)}</code></td><td>{len(reason.records)}</td>"
        f"<td>{', '.join(f'<code>{text(v)}</code>' for v in reason.versions)}</td>"
        f'<td><details class="cells"><summary>{count(len(reason.cells), "cell")}</summary>'
        f"{_cell_names(reason.cells)}</details></td></tr>"
        for reason in reasons
    )
    return (
        f'<h2 id="skipped">{summary.skipped_title}</h2>\n'
        f'<table id="skips"><tr><th>reason</th><th>tests</th><th>torch</th><th>cells</th></tr>{rows}</table>'
    )


def _drift(results: RunResults) -> str:
    """Per (suite, test, measure): the worst value per torch version, then per cell in an expandable table."""
    versions = [v.torch for v in results.versions]
    worst: dict[tuple[str, str, str], dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for record in results.tests:
        if record.ran_in is not None:
            continue
        for name, value in record.figures.items():
            if is_drift_figure(name) and isinstance(value, float):
                per_cell = worst[(record.suite, record.test, drift_measure(name))][record.cell]
                previous = per_cell.get(record.torch)
                per_cell[record.torch] = _worse(previous, abs(value))
    if not worst:
        return "<h2>Drift</h2>\n<p>No test recorded drift figures in this run.</p>"
    ratio = results.settings.drift_ratio
    head = "".join(f"<th><code>{text(v)}</code></th>" for v in versions)
    blocks = []
    for (suite, test, measure), cells in worst.items():
        overall: dict[str, float] = {}
        for per_version in cells.values():
            for version, value in per_version.items():
                overall[version] = _worse(overall.get(version), value)
        cell_rows = "".join(
            f"<tr><th><code>{text(cell)}</code></th>{_values(per_version, versions)}"
            f"<td>{_chart(per_version, versions, results.baseline, ratio)}</td></tr>"
            for cell, per_version in cells.items()
        )
        blocks.append(
            f"<tr><td><code>{text(suite)}</code></td><td><code>{text(test)}</code></td><td><code>{text(measure)}</code></td>"
            f"{_values(overall, versions)}<td>{_chart(overall, versions, results.baseline, ratio)}"
            f"<details><summary>{len(cells)} cells</summary><table><tr><th>cell</th>{head}<th></th></tr>{cell_rows}</table>"
            "</details></td></tr>"
        )
    return (
        "<h2>Drift</h2>\n<p>Worst value over cells and tensors per torch version, on a log scale; grey is the baseline, "
        f"red grew more than {ratio:g}× over it.</p>\n"
        f'<table id="drift"><tr><th>suite</th><th>test</th><th>figure</th>{head}<th>across versions</th></tr>'
        + "\n".join(blocks)
        + "</table>"
    )


def _worse(previous: float | None, value: float) -> float:
    if previous is None or math.isnan(value):
        return value
    return previous if math.isnan(previous) else max(previous, value)


def _values(per_version: dict[str, float], versions: list[str]) -> str:
    return "".join(f"<td>{per_version[v]:.3g}</td>" if v in per_version else "<td>·</td>" for v in versions)


def _chart(per_version: dict[str, float], versions: list[str], baseline: str, ratio: float) -> str:
    """A bar per torch version, log-scaled between the row's smallest and largest positive value;
    a row whose figures are all 0 says so instead of drawing empty axes."""
    if all(value == 0 for value in per_version.values()):
        return '<span class="all-zero">all 0</span>'
    logs = [math.log10(v) for v in per_version.values() if v > 0 and math.isfinite(v)]
    low, high = (min(logs) - 1, max(logs)) if logs else (0.0, 1.0)
    base = per_version.get(baseline)
    bars = []
    for i, version in enumerate(versions):
        value = per_version.get(version)
        if value is None:
            continue
        if value > 0 and math.isfinite(value):
            height = 3 + (CHART_HEIGHT - 3) * (math.log10(value) - low) / max(high - low, 1e-12)
        else:
            height = CHART_HEIGHT if value != 0 else 1
        kind = "base" if version == baseline else "grown" if base is not None and grew(base, value, ratio) else "same"
        kind = "zero" if value == 0 and kind != "base" else kind
        x = i * (CHART_BAR + 2)
        bars.append(
            f'<rect class="{kind}" x="{x}" y="{CHART_HEIGHT - height:.1f}" width="{CHART_BAR}" height="{height:.1f}">'
            f"<title>torch {text(version)}: {value:.3g}</title></rect>"
        )
    width = len(versions) * (CHART_BAR + 2)
    return (
        f'<svg width="{width}" height="{CHART_HEIGHT}" viewBox="0 0 {width} {CHART_HEIGHT}" role="img" '
        f'aria-label="drift across torch versions">{"".join(bars)}</svg>'
    )
