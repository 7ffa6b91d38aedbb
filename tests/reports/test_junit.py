"""Per-cell JUnit and the merged file: statuses, hostile text, schema validity, nothing missing."""

from __future__ import annotations

from junitparser import JUnitXml
from lxml import etree

from torchmatrix.env.devices import Environment
from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.config import Suite
from torchmatrix.matrix.plan import plan_runs
from torchmatrix.messages.events import Collected, TestFinished, TestStarted
from torchmatrix.reports import junit
from torchmatrix.run.outcomes import OutcomeBook

from helpers.checkout import REPO

SCHEMA = etree.XMLSchema(etree.parse(str(REPO / "tests" / "data" / "junit-10.xsd")))
ENVIRONMENT = Environment(torch="2.13.0+cpu", git_version="abc")
HOSTILE = "bad <script>alert(\"x\")</script> & 'quotes' \x00\x07\x1b[31m ]]> end"


def book_with_every_status():
    cells = [Cell({"world_size": 1, "fsdp": "none"}), Cell({"world_size": 2, "fsdp": "fsdp2"})]
    suites = {"demo": Suite("demo", "suites/test_demo.py", 10.0, ("world_size", "fsdp"))}
    runs = plan_runs(cells, suites)
    book = OutcomeBook(runs)
    for run in runs:
        book.feed(Collected({run.key: ["test_pass", "test_fail", "test_skip", "test_missing"]}), 0.0)
        for name, status in (("test_pass", "passed"), ("test_fail", "failed"), ("test_skip", "skipped")):
            book.feed(
                TestFinished(
                    nodeid=name,
                    suite="demo",
                    cell=run.cell.id,
                    test=name,
                    status=status,
                    duration=1e-7,
                    message=HOSTILE if status != "passed" else "",
                    text=HOSTILE,
                    properties=[["drift", 1e-9]],
                    stdout=HOSTILE,
                ),
                0.0,
            )
    book.close_group([run.key for run in runs], "pytest exited with code 3", "log tail")
    return cells, book


def write_run(tmp_path):
    cells, book = book_with_every_status()
    for cell in cells:
        junit.write_suites(
            tmp_path / "torch-2.13.0" / f"{cell.id}.xml",
            [junit.cell_report("2.13.0", ENVIRONMENT, cell, book.for_cell(cell))],
        )
    return junit.merge_run(tmp_path, "2.13.0")


def test_every_status_and_the_missing_test_appear(tmp_path):
    xml = JUnitXml.fromfile(str(write_run(tmp_path)))
    suites = list(xml)
    assert [s.name for s in suites] == ["torch-2.13.0/ws1-none", "torch-2.13.0/ws2-fsdp2"]
    for suite in suites:
        assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (4, 1, 1, 1)
        missing = next(c for c in suite if c.name.startswith("test_missing"))
        assert missing.is_error and missing.result[0].message == "pytest exited with code 3"


def test_merged_file_validates_even_with_hostile_text(tmp_path):
    merged = write_run(tmp_path)
    assert SCHEMA.validate(etree.parse(str(merged))), SCHEMA.error_log
    text = merged.read_text()
    assert "<script>" not in text
    assert "\\x00" in text and "\\x1b" in text, "control characters are escaped, not dropped"


def test_testcase_names_are_unique_and_carry_torch_and_cell(tmp_path):
    xml = JUnitXml.fromfile(str(write_run(tmp_path)))
    names = [case.name for suite in xml for case in suite]
    assert len(names) == len(set(names))
    assert "test_fail[torch=2.13.0,ws2-fsdp2]" in names


def test_recorded_properties_are_suite_properties(tmp_path):
    xml = JUnitXml.fromfile(str(write_run(tmp_path)))
    props = {p.name: p.value for p in next(iter(xml)).properties()}
    assert props["demo::test_pass::drift"] == "1e-09"
    assert props["axis.fsdp"] == "none" and props["torch.build"] == "2.13.0+cpu"


def test_a_run_that_never_collected_gets_one_error_case_per_suite():
    cells = [Cell({"world_size": 1})]
    book = OutcomeBook(plan_runs(cells, {"demo": Suite("demo", "suites/test_demo.py", 10.0, ("world_size",))}))
    book.close_group(list(book.runs), "torch==9.9 failed to install", "pip said no")
    [(_, outcome)] = book.for_cell(cells[0])
    assert (outcome.test, outcome.status, outcome.text) == ("demo", "error", "pip said no")


def test_each_testsuite_is_stamped_when_its_cell_started_not_when_reports_were_written():
    cells, book = book_with_every_status()
    first, second = cells
    run_keys = {cell: [run.key for run in book.cell_runs(cell)] for cell in cells}
    suite, cell_id = run_keys[second][0].split("|")
    book.feed(TestStarted(suite, cell_id, "t", started=1767323045.0), now=0.0)
    assert book.cell_started(first) is None, "no test of it has started"
    assert book.cell_started(second) == 1767323045.0, "when the event log says, not when it was read"
    stamped = junit.cell_report("2.13.0", ENVIRONMENT, second, book.for_cell(second), book.cell_started(second))
    assert stamped.timestamp == "2026-01-02T03:04:05+00:00"


def test_a_cell_is_stamped_when_its_own_tests_started_not_the_run_another_cell_ran_for_it():
    cells = [Cell({"world_size": 1, "fsdp": "none"}), Cell({"world_size": 1, "fsdp": "fsdp2"})]
    suites = {
        "shared": Suite("shared", "suites/test_shared.py", 10.0, ("world_size",)),
        "own": Suite("own", "suites/test_own.py", 10.0, ("world_size", "fsdp")),
    }
    book = OutcomeBook(plan_runs(cells, suites))
    for suite, cell, started in (("shared", cells[0], 100.0), ("own", cells[0], 101.0), ("own", cells[1], 110.0)):
        book.feed(TestStarted(suite, cell.id, "t", started=started), now=0.0)
    assert book.cell_started(cells[0]) == 100.0
    assert book.cell_started(cells[1]) == 110.0, "not the 100.0 of the shared run ws1-none ran for it"
