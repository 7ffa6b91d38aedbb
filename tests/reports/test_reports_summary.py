"""summary.md against its golden file, summary.html's structure, hostile text in md/html/json, CI hooks."""

from __future__ import annotations

import dataclasses
import json
import re
from html.parser import HTMLParser

import pytest
from junitparser import JUnitXml
from lxml import etree

from torchmatrix.matrix.plan import SuiteRun
from torchmatrix.reports import junit, summary_html, summary_md
from torchmatrix.reports.report import write_report
from torchmatrix.reports.reproducible import is_reproducible
from torchmatrix.reports.run_reader import load_results
from torchmatrix.reports.upgrade_diff import SLOWDOWN_RULE
from torchmatrix.run import confirmation

from helpers.checkout import REPO
from helpers.projects import Project
from helpers.report_runs import (
    BASELINE,
    CANDIDATE,
    HOSTILE,
    SUITES,
    check_golden,
    outcomes,
    write_hostile_run,
    write_project,
    write_version,
)

OWN_TAGS = re.compile(r"</?details>|<summary>show the text</summary>")  # the page's own, around fenced text
SCHEMA = etree.XMLSchema(etree.parse(str(REPO / "tests" / "data" / "junit-10.xsd")))
INVISIBLE = ("\x9b", "\u202e", "\x07")
PAGE_TAGS = {
    "html", "head", "meta", "title", "style", "body", "script", "h1", "h2", "h3", "p", "code", "pre", "span", "a",
    "table", "thead", "tbody", "tr", "th", "td", "form", "label", "select", "option", "details", "summary", "svg",
    "rect", "section", "em", "ul", "li",
}  # fmt: skip


def test_summary_md_matches_golden(run_dir):
    write_report(run_dir)
    check_golden(run_dir, "summary.md")


def test_summary_html_gives_the_repro_command_of_confirmed_failures_only(run_dir):
    write_report(run_dir)
    page = (run_dir / "summary.html").read_text()
    command = "torchmatrix repro reports/run-fixture 2.14.1/ws2-fsdp2/alpha::test_regress"
    assert f"reproduce: <code>{command}</code>" in page
    tests = load_results(run_dir).tests
    assert (
        page.count("reproduce: <code>")
        == sum(is_reproducible(r) for r in tests)
        < sum(r.status.is_failing for r in tests)
    )


def test_report_command_writes_every_file_and_the_step_summary(run_dir, tmp_path, monkeypatch):
    step_summary = tmp_path / "step_summary.md"
    step_summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    done = Project(tmp_path / "project").torchmatrix("report", str(run_dir))
    assert done.returncode == 0, done.stderr
    for name in ("junit.xml", "results.json", "summary.md", "summary.html"):
        assert (run_dir / name).is_file(), name
    assert step_summary.read_text() == "earlier step\n" + (run_dir / "summary.md").read_text() + "\n"
    last = done.stdout.splitlines()
    assert last[-8] == (
        f"torchmatrix: 76 passed, 3 failed, 4 errors, 4 skipped, 1 CPU-simulation limits; read {run_dir / 'summary.md'} "
        f"or {run_dir / 'summary.html'}"
    ), "the run ends pointing at its summaries"
    assert last[-7] == "torchmatrix: failures by root cause (4):"
    assert last[-6].startswith("  4 tests in 2 cells, torch 2.13.0, 2.14.1: "), last
    assert last[-2:] == [
        "torchmatrix: CPU-simulation limits, not failures of the stack (1):",
        "  1 test in 1 cell, torch 2.14.1: CPU-simulation limit: RuntimeError: Cannot use ReduceOp.PREMUL_SUM with "
        "Gloo; hint: call set_force_sum_reduction_for_comms(True) on the fully_shard modules in CPU cells, or drop the "
        "divide factor",
    ], "limits are listed apart from the failures, with their hint"


def test_merged_junit_validates_parses_and_keeps_names_unique_and_properties(run_dir):
    write_report(run_dir)
    merged = run_dir / "junit.xml"
    assert SCHEMA.validate(etree.parse(str(merged))), SCHEMA.error_log
    suites = list(JUnitXml.fromfile(str(merged)))
    assert len(suites) == 8, "one testsuite per (torch version, cell)"
    keys = [(case.classname, case.name) for suite in suites for case in suite]
    assert len(keys) == len(set(keys))
    first = next(suite for suite in suites if suite.name == "torch-2.13.0/ws1-none")
    properties = {p.name: p.value for p in first.properties()}
    assert properties["axis.fsdp"] == "none" and properties["alpha::test_drift[0.0]::grad_max_abs/layer0.w"] == "1e-09"


def test_summary_html_is_self_contained_and_has_the_grid(run_dir):
    write_report(run_dir)
    page = (run_dir / "summary.html").read_text()
    assert not re.search(r"(src|href)=\"(https?:)?//", page), "no network: every resource is inline"
    assert "default-src 'none'" in page
    assert page.count('class="cell-row"') == 4
    assert len(re.findall(r'<details class="failure" id="failure-', page)) == 4, "test_broken's text is shown once"
    assert "the same text in 2 failing tests" in page
    assert "Failures: 3 failed and 4 errored tests in 4 groups by root cause" in page
    broken = page.index("<code>test_broken</code> in <code>ws2-none</code>")
    assert page[broken:].startswith(
        '<code>test_broken</code> in <code>ws2-none</code> <details class="cells"><summary>and 1 more cell</summary>'
        "<code>ws2-fsdp2</code></details>"
    ), "the cells a shared result stands for are named, collapsed"
    assert page.count('<a class="mark partly-skipped"') == 2, "passed with some skipped is not all passed"
    skips = page[page.index('<h2 id="skipped">') :]
    assert skips.startswith('<h2 id="skipped">Skipped: 4 tests for 1 reason</h2>')
    assert "<td><code>needs TransformerEngine</code></td><td>4</td><td><code>2.14.1</code></td>" in skips
    assert "<summary>4 cells</summary><code>ws1-none</code>, <code>ws1-fsdp2</code>, <code>ws2-none</code>" in skips
    assert "Upgrade diff <code>2.13.0</code> → <code>2.14.1</code>" in page
    assert "<svg" in page, "drift across versions is drawn"
    assert f"<p>{SLOWDOWN_RULE}</p>" in page, "the slowdown rule is stated, as summary.md states it"


def test_html_totals_count_what_failures_did_alone_and_colour_only_those_not_order_dependent(run_dir):
    write_report(run_dir)
    page = (run_dir / "summary.html").read_text()
    totals = page[page.index('<table id="totals">') : page.index("</table>", page.index('<table id="totals">'))]
    assert (
        "<th>skipped</th><th>CPU-simulation limits</th><th>fail alone</th><th>passed alone</th><th>unconfirmed</th></tr>"
    ) in totals
    assert (
        f"<tr><th><code>{CANDIDATE}</code></th><td>4</td><td>35</td><td>2</td><td>2</td><td>4</td><td>1</td>"
        '<td class="bad">3</td><td class="warn">1</td><td>0</td></tr>'
    ) in totals, "2 failed + 2 errors: 3 fail alone (red), 1 passed alone (order-dependent, not red); 1 limit, not red"


def test_a_drift_figure_that_is_0_everywhere_says_all_0_instead_of_drawing_empty_axes(run_dir):
    write_report(run_dir)
    page = (run_dir / "summary.html").read_text()
    drift = page[page.index('<table id="drift">') :]
    zero = drift[drift.index("<td><code>loss_max_abs</code></td>") :]
    zero = zero[: zero.index("<details>")]
    assert "<td>0</td><td>0</td>" in zero, "the fixture's loss_max_abs is 0 under both versions"
    assert '<span class="all-zero">all 0</span>' in zero and "<svg" not in zero
    grown = drift[drift.index("<td><code>grad_max_abs</code></td>") :]
    assert grown[: grown.index("<details>")].count("<svg") == 1, "a figure that is not all 0 is drawn"


def _not_rerun(capped: int | None):
    """outcomes() as a run with confirmation off (`capped` None) or test_broken past --confirm-limit `capped`
    shows them: confirmation.record writes the note the page reads back."""

    def outcome_for(version, suite, cell):
        found = outcomes(version, suite, cell)
        for outcome in found:
            if outcome.status.is_failing and (capped is None or outcome.test == "test_broken"):
                outcome.confirmation = None
                if capped is not None:
                    confirmation.record(
                        [], [], [confirmation.Retry(SuiteRun(SUITES[suite], cell, (cell,)), outcome)], capped
                    )
        return found

    return outcome_for


@pytest.mark.parametrize(
    ("capped", "note", "baseline_totals"),
    [
        (
            None,
            "No failing test was re-run alone (confirmation switched off by --confirm-limit 0, or a suite that never "
            "collected): none is confirmed, and any may be order-dependent or flaky.",
            "| 1 | 2 | 0 | 0 | 0 | 0 | 3 |",
        ),
        (
            2,
            "3 of 7 failing tests were re-run alone in a fresh process: 2 fail alone (a behaviour of that torch), "
            "1 passed alone (order-dependent or flaky); 4 were not re-run (past --confirm-limit 2) and count as unconfirmed.",
            "| 1 | 2 | 0 | 0 | 1 | 0 | 2 |",
        ),
    ],
    ids=["confirmation-off", "past-the-cap"],
)
def test_the_failures_preamble_says_how_many_were_re_run_alone_and_why_the_rest_were_not(
    tmp_path, capped, note, baseline_totals
):
    root = tmp_path / "project"
    matrix = write_project(root)
    run_dir = root / "reports" / "capped"
    for version in (BASELINE, CANDIDATE):
        write_version(run_dir, version, matrix, outcome_for=_not_rerun(capped))
    write_report(run_dir)
    markdown, page = (run_dir / "summary.md").read_text(), (run_dir / "summary.html").read_text()
    assert f"first failing rank. {note}\n" in markdown
    assert f"first failing rank. {note}</p>" in page
    assert "Every failing test was re-run" not in markdown + page
    baseline_row = next(line for line in markdown.splitlines() if line.startswith(f"| `{BASELINE}`"))
    assert baseline_row.endswith(baseline_totals), (
        "failed, errors, skipped, limits, fail alone, passed alone, unconfirmed"
    )


def test_markdown_says_how_many_failure_texts_of_a_cause_it_left_out(run_dir):
    results = load_results(run_dir)
    failing = results.tests[0]
    extra = [
        dataclasses.replace(
            failing, test=f"test_many[{i}]", status="failed", message="RuntimeError: boom", text=f"text {i}"
        )
        for i in range(summary_md.MAX_TEXTS_PER_CAUSE + 2)
    ]
    markdown = summary_md.render(dataclasses.replace(results, tests=results.tests + extra), [])
    cause = markdown[markdown.index("`RuntimeError: boom`") :]
    cause = cause[: cause.index("\n#### ")]
    assert cause.count("show the text") == summary_md.MAX_TEXTS_PER_CAUSE
    assert "… and 2 more distinct texts of this cause in summary.html." in cause
    assert "text 4" in summary_html.render(dataclasses.replace(results, tests=results.tests + extra), [])


def code_spans_removed(line: str) -> str:
    return re.sub(r"(`+)(.+?)\1", "", line)


def test_hostile_text_stays_literal_in_markdown(tmp_path):
    markdown = (write_hostile_run(tmp_path) / "summary.md").read_text()
    assert not any(c in markdown for c in INVISIBLE), "control and bidi characters are shown as escapes"
    assert "\\x9b31m" in markdown and "\\u202e" in markdown
    fence, columns = None, None
    for line in markdown.splitlines():
        stripped = line.strip()
        if fence is None and stripped.startswith("```"):
            fence = re.match("`+", stripped).group()
            continue
        if fence is not None:
            fence = None if stripped == fence else fence
            continue
        outside = OWN_TAGS.sub("", code_spans_removed(line))
        assert "<" not in outside and "[link]" not in outside and "**bold**" not in outside, line
        pipes = len(re.findall(r"(?<!\\)\|", line))
        if line.startswith("|"):
            columns = columns or pipes
            assert pipes == columns, f"an unescaped pipe split a table row: {line}"
        else:
            columns = None


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.handlers, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.handlers += [name for name, _ in attrs if name.startswith("on")]

    def handle_data(self, data):
        self.text.append(data)


def test_hostile_text_stays_literal_in_html(tmp_path):
    page = (write_hostile_run(tmp_path) / "summary.html").read_text()
    assert page.count("<script") == 1 and "alert(" not in page.replace("alert(&#34;", "")
    assert not any(c in page for c in INVISIBLE)
    parser = Tags()
    parser.feed(page)
    assert parser.tags.count("script") == 1 and not parser.handlers
    assert set(parser.tags) <= PAGE_TAGS, set(parser.tags) - PAGE_TAGS
    assert 'x<script>alert("pwned")</script>' in "".join(parser.text), "shown to the reader as text"


def test_hostile_text_round_trips_in_json(tmp_path):
    raw = (write_hostile_run(tmp_path) / "results.json").read_text()
    assert all(c == "\n" or " " <= c <= "~" for c in raw), "the file itself is plain printable ASCII"
    [record] = json.loads(raw)["tests"]
    assert record["message"] == junit.xml_text(HOSTILE), "exactly what the JUnit file holds"
    assert record["figures"] == {f"grad_max_abs/{junit.xml_text(HOSTILE)}": 0.5}


MATRIX = """
[torch]
versions = ["2.13.0"]

[axes]
world_size = [1]
flavor = ["plain", "spicy"]

[suites.figures]
path = "suites/test_figures.py"
timeout = 30
axes = ["world_size"]
"""

FIGURES_SUITE = """
def test_records_drift(cell, record_property):
    record_property("grad_max_abs/w", 2.5e-7)


def test_fails(cell):
    assert cell.world_size == 2, "one rank is not two"
"""


@pytest.mark.slow
def test_a_real_run_reports_its_figures_and_failures(tmp_path):
    """`run --torch system` then `report`: figures recorded in a rank's test reach results.json and both pages."""
    project = Project(tmp_path)
    project.write("matrix.toml", MATRIX)
    project.write("suites/test_figures.py", FIGURES_SUITE)
    run = project.torchmatrix("run", "--torch", "system", "--reports", "out", "--run-id", "real", timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    report = project.torchmatrix("report", "out/real")
    assert report.returncode == 0, report.stderr
    data = json.loads((tmp_path / "out" / "real" / "results.json").read_text())
    by_test = {(t["cell"], t["test"]): t for t in data["tests"]}
    drift = by_test[("ws1-spicy", "test_records_drift")]
    figures = dict(drift["figures"])
    assert figures.pop("cpu_seconds") >= 0  # every test records its CPU time beside its own figures
    assert figures.pop("peak_rss_bytes") > 100 * 2**20  # and its ranks' resident peak: torch alone holds more
    assert (drift["status"], drift["ran_in"], figures) == ("passed", "ws1-plain", {"grad_max_abs/w": 2.5e-7})
    assert by_test[("ws1-plain", "test_fails")]["message"].startswith("AssertionError: one rank is not two")
    assert data["versions"][0]["torch"] == "system" and data["versions"][0]["planned_cells"] == [
        "ws1-plain",
        "ws1-spicy",
    ]
    markdown = (tmp_path / "out" / "real" / "summary.md").read_text()
    assert "| `ws1-plain` | ❌ |" in markdown and "one rank is not two" in markdown
    assert "grad_max_abs" in (tmp_path / "out" / "real" / "summary.html").read_text()


def test_a_filtered_run_says_so_and_starts_when_its_first_version_started(run_dir):
    plan_path = run_dir / f"torch-{BASELINE}" / "plan.json"
    plan = json.loads(plan_path.read_text())
    plan.update(only={"fsdp": ["fsdp2", "none"]}, keyword="not ws4", shard="1/2", started="2026-01-02T02:00:00+00:00")
    plan_path.write_text(json.dumps(plan))
    write_report(run_dir)
    markdown = (run_dir / "summary.md").read_text()
    assert (
        "**Filtered run**, not the whole matrix: torch `2.13.0`: `--only fsdp=fsdp2,none -k 'not ws4' --shard 1/2`"
        in markdown
    )
    assert "started `2026-01-02T02:00:00+00:00`" in markdown, "the run's start, not a cell's"
    page = (run_dir / "summary.html").read_text()
    assert "Filtered run, not the whole matrix: torch <code>2.13.0</code>: <code>--only fsdp=fsdp2,none" in page
