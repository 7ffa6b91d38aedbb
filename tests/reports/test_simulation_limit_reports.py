"""A CPU-simulation limit in every report: JUnit (schema-valid), results.json, summary.md and
summary.html, the upgrade diff and `compare`, the closing lines; never re-run alone; and a real
run whose only non-pass is FSDP2's PREMUL_SUM on gloo exits 0 with it marked."""

from __future__ import annotations

import html
import json
import re

import pytest
from junitparser import JUnitXml, Skipped
from lxml import etree

from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.plan import plan_runs
from torchmatrix.messages.events import TestOutcome as Outcome  # not collected as a test class
from torchmatrix.reports import results_json
from torchmatrix.reports.closing import closing_lines
from torchmatrix.reports.report import load_run, write_report
from torchmatrix.run import confirmation
from torchmatrix.run.outcomes import OutcomeBook
from torchmatrix.status import Status, tally

from helpers.checkout import REPO
from helpers.matrix_files import matrix_toml
from helpers.projects import Project
from helpers.report_runs import (
    BASELINE,
    CANDIDATE,
    PREMUL_SUM_LIMIT,
    SUITES,
    outcomes,
    write_fixture_run,
    write_project,
    write_version,
)

SCHEMA = etree.XMLSchema(etree.parse(str(REPO / "tests" / "data" / "junit-10.xsd")))
HINT = "call set_force_sum_reduction_for_comms(True) on the fully_shard modules in CPU cells, or drop the divide factor"


@pytest.fixture
def run_dir(tmp_path):
    """The fixture run: alpha's test_divide hits PREMUL_SUM on gloo in ws2-none under the candidate."""
    run_dir = write_fixture_run(tmp_path / "project")
    write_report(run_dir)
    return run_dir


def test_junit_writes_a_limit_as_a_skipped_of_its_own_type_with_the_hint_and_the_full_text(run_dir):
    merged = run_dir / "junit.xml"
    assert SCHEMA.validate(etree.parse(str(merged))), SCHEMA.error_log
    suite = next(s for s in JUnitXml.fromfile(str(merged)) if s.name == f"torch-{CANDIDATE}/ws2-none")
    case = next(c for c in suite if c.name.startswith("test_divide["))
    [result] = case.result
    assert isinstance(result, Skipped) and result.type == "CPU-simulation limit"
    assert (
        result.message == f"CPU-simulation limit: RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo; hint: {HINT}"
    )
    assert "foreach_reduce" in result.text, "the full traceback stays with it"
    assert suite.failures + suite.errors == 1, "only beta's test_broken: the limit is no failure for CI"


def test_results_json_carries_the_status_and_counts_it_apart(run_dir):
    data = json.loads((run_dir / "results.json").read_text())
    [limit] = [t for t in data["tests"] if t["status"] == "CPU-simulation limit"]
    assert (limit["torch"], limit["cell"], limit["test"], limit["message"]) == (
        CANDIDATE,
        "ws2-none",
        "test_divide",
        PREMUL_SUM_LIMIT,
    )
    assert data["schema_version"] == results_json.SCHEMA_VERSION
    assert data["versions"][1]["totals"]["CPU-simulation limit"] == 1
    assert data["run"]["totals"]["failed"] == 3, "the limit is not among the failures"


def test_summary_md_marks_it_in_the_grid_and_gives_it_its_own_section(run_dir):
    markdown = (run_dir / "summary.md").read_text()
    row = next(line for line in markdown.splitlines() if line.startswith("| `ws2-none` |"))
    assert row == "| `ws2-none` | ✅💥 | 🖥️💥 |", "alpha's mark in ws2-none under the candidate"
    section = markdown[markdown.index("### CPU-simulation limits: 1 test in 1 group") :]
    section = section[: section.index("### Skipped")]
    assert f"#### 1. `{PREMUL_SUM_LIMIT}`" in section
    assert "- CPU-simulation limit · torch `2.14.1` · `alpha` `test_divide` in `ws2-none`\n" in section
    failures = markdown[markdown.index("### Failures") : markdown.index("### CPU-simulation limits")]
    assert "PREMUL_SUM" not in failures


def test_summary_html_marks_it_links_it_and_keeps_it_out_of_the_failures(run_dir):
    page = (run_dir / "summary.html").read_text()
    mark = re.search(r'<a class="mark simulation-limit" title="alpha: CPU-simulation limit" href="#(limit-0-0)">', page)
    assert mark, "the grid's limit mark links to its text"
    section = page[page.index('<h2 id="simulation-limits">CPU-simulation limits: 1 test in 1 group</h2>') :]
    assert f"<h3><code>{PREMUL_SUM_LIMIT}</code></h3>" in html.unescape(section)
    assert '<details class="failure" id="limit-0-0">' in section
    totals = page[page.index('<table id="totals">') :]
    assert "<td>4</td><td>1</td><td class=" in totals, "skipped 4, then 1 limit, not coloured"
    assert "Failures: 3 failed and 4 errored tests in 4 groups" in page


def test_the_closing_lines_list_it_apart_from_the_failures(run_dir):
    lines = closing_lines(load_run(run_dir), run_dir).splitlines()
    assert lines[0].startswith("torchmatrix: 76 passed, 3 failed, 4 errors, 4 skipped, 1 CPU-simulation limits;")
    assert lines[-2:] == [
        "torchmatrix: CPU-simulation limits, not failures of the stack (1):",
        f"  1 test in 1 cell, torch 2.14.1: {PREMUL_SUM_LIMIT}",
    ]


def _limit_in_ws2_none(version, suite, cell):
    """outcomes() of the baseline, but test_divide hits the limit in ws2-none."""
    found = outcomes(version, suite, cell)
    return [
        Outcome("alpha", o.test, "CPU-simulation limit", 0.5, PREMUL_SUM_LIMIT)
        if o.test == "test_divide" and cell.id == "ws2-none"
        else o
        for o in found
    ]


def test_compare_lists_a_new_limit_as_newly_skipped_and_exits_0(tmp_path):
    root = tmp_path / "project"
    matrix = write_project(root)
    write_version(root / "reports" / "before", BASELINE, matrix)
    write_version(root / "reports" / "after", BASELINE, matrix, outcome_for=_limit_in_ws2_none)
    done = Project(root).torchmatrix("compare", "reports/before", "reports/after")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 regressions, 0 fixes" in done.stdout and "1 newly skipped" in done.stdout
    newly = done.stdout[done.stdout.index("#### Newly skipped") :]
    assert "| `alpha` | `test_divide` | `ws2-none` | passed | CPU-simulation limit |" in newly


def test_a_limit_is_not_re_run_alone():
    cell = Cell({"world_size": 2, "fsdp": "none"})
    [run] = [r for r in plan_runs([cell], {"alpha": SUITES["alpha"]})]
    book = OutcomeBook([run])
    book.expect(run.key, ["test_divide", "test_regress"])
    book.tests[run.key] += [
        Outcome("alpha", "test_divide", Status.SIMULATION_LIMIT, 0.5, PREMUL_SUM_LIMIT),
        Outcome("alpha", "test_regress", Status.FAILED, 0.5, "AssertionError: x"),
    ]
    assert [retry.outcome.test for retry in confirmation.retries(book)] == ["test_regress"]


PREMUL_SUITE = """
import torch


def _fsdp2_backward(force_sum):
    from torch.distributed.fsdp import fully_shard

    model = torch.nn.Linear(4, 4)
    fully_shard(model)
    model.set_gradient_divide_factor(3.0)
    model.set_force_sum_reduction_for_comms(force_sum)
    model(torch.ones(2, 4)).sum().backward()
    return "ok"


def test_divide_factor(cell, ranks):
    ranks.run(_fsdp2_backward, False)


def test_divide_factor_with_the_hint(cell, ranks):
    assert ranks.run(_fsdp2_backward, True) == ["ok"] * cell.world_size
"""


@pytest.mark.slow
def test_a_run_whose_only_non_pass_is_premul_sum_on_gloo_exits_0_and_marks_it(project):
    project.write_suites(
        matrix_toml(axes={"world_size": [2]}, suites={"premul": {"timeout": 120}}), test_premul=PREMUL_SUITE
    )
    done = project.torchmatrix("run", "--torch", "system", "--reports", "out")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "torch system: 1 passed, 0 failed, 0 errors, 0 skipped, 1 CPU-simulation limits;" in done.stdout
    assert (
        "  1 test in 1 cell, torch system: CPU-simulation limit: RuntimeError: Cannot use ReduceOp.PREMUL_SUM "
        f"with Gloo; hint: {HINT}"
    ) in done.stdout, "the closing lines name the limit and its hint"
    results = load_run(project.root / "out" / "latest")
    statuses = {record.test: record.status for record in results.tests}
    assert statuses == {"test_divide_factor": Status.SIMULATION_LIMIT, "test_divide_factor_with_the_hint": "passed"}
    limit = next(record for record in results.tests if record.test == "test_divide_factor")
    assert (limit.confirmation, limit.confirmation_note) == (None, ""), "a limit is not re-run alone"


def test_terminal_totals_name_limits_only_where_there_are_any():
    counts = dict.fromkeys(Status, 0) | {Status.PASSED: 3}
    assert tally(counts) == "3 passed, 0 failed, 0 errors, 0 skipped", "a GPU run's line is unchanged"
    assert (
        tally(counts | {Status.SIMULATION_LIMIT: 2})
        == "3 passed, 0 failed, 0 errors, 0 skipped, 2 CPU-simulation limits"
    )
