"""End to end: `python -m torchmatrix run --torch system` on a small CPU matrix, read back as JUnit."""

from __future__ import annotations

import json

import pytest
from junitparser import JUnitXml
from lxml import etree

from helpers.checkout import REPO
from helpers.matrix_files import matrix_toml

pytestmark = pytest.mark.slow

MATRIX = matrix_toml(
    torch=["2.13.0"],
    axes={"world_size": [1, 2], "flavor": ["plain", "spicy"]},
    suites={"demo": {"timeout": 4, "axes": ["world_size"]}, "per_cell": {"timeout": 30}},
)

DEMO_SUITE = """
import time

import torch.distributed as dist


def _rank():
    return dist.get_rank()


def _raise_on_rank_1():
    if dist.get_rank() == 1:
        raise RuntimeError("rank one is unhappy")
    return 0


def _sleep_forever():
    while True:
        time.sleep(0.1)


def test_ranks_answer(cell, ranks):
    assert ranks.run(_rank) == list(range(cell.world_size))


def test_hangs_on_two_ranks(cell, ranks):
    if cell.world_size == 2:
        ranks.run(_sleep_forever)


def test_after_the_hang_still_runs(cell, ranks, record_property):
    record_property("max_abs_diff", 0.5)
    assert ranks.run(_rank) == list(range(cell.world_size))


def test_fails_on_rank_1(cell, ranks):
    ranks.run(_raise_on_rank_1)


def test_skips_with_reason(cell):
    import pytest

    pytest.skip("not applicable to this cell")
"""

PER_CELL_SUITE = """
import os


def test_crashes_the_process_for_spicy_ws2(cell):
    if cell.id == "ws2-spicy":
        os._exit(3)
"""


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from helpers.projects import Project

    project = Project(tmp_path_factory.mktemp("e2e") / "project")
    project.write_suites(MATRIX, test_demo=DEMO_SUITE, test_per_cell=PER_CELL_SUITE)
    # two slots on any machine: the ws2 cells share one process, ws2-spicy's own suite after ws2-plain's hang
    done = project.torchmatrix("run", "--torch", "system", "--reports", "out", "--slots", "2")
    return project, done


def merged(project) -> JUnitXml:
    return JUnitXml.fromfile(str(project.root / "out" / "latest" / "junit.xml"))


def cases(project) -> dict[tuple[str, str], object]:
    """(cell id, test name) -> testcase, across the merged file."""
    found = {}
    for suite in merged(project):
        cell = suite.name.split("/", 1)[1]
        for case in suite:
            found[(cell, case.name.split("[", 1)[0])] = case
    return found


def test_exit_code_is_1_when_anything_failed(finished_run):
    _, done = finished_run
    assert done.returncode == 1, done.stdout + done.stderr


def test_every_planned_cell_is_in_the_merged_report(finished_run):
    project, _ = finished_run
    names = sorted(suite.name for suite in merged(project))
    assert names == [
        "torch-system/ws1-plain",
        "torch-system/ws1-spicy",
        "torch-system/ws2-plain",
        "torch-system/ws2-spicy",
    ]
    assert sorted(p.name for p in (project.root / "out" / "latest" / "torch-system").glob("*.xml")) == [
        f"{n.split('/')[1]}.xml" for n in names
    ]


def test_testcase_names_are_unique_across_the_file(finished_run):
    project, _ = finished_run
    pairs = [(case.classname, case.name) for suite in merged(project) for case in suite]
    assert len(pairs) == len(set(pairs))


def test_merged_report_validates_against_the_jenkins_schema(finished_run):
    project, _ = finished_run
    schema = etree.XMLSchema(etree.parse(str(REPO / "tests" / "data" / "junit-10.xsd")))
    document = etree.parse(str(project.root / "out" / "latest" / "junit.xml"))
    assert schema.validate(document), schema.error_log


def test_properties_carry_torch_device_and_axes(finished_run):
    project, _ = finished_run
    suite = next(s for s in merged(project) if s.name.endswith("ws2-spicy"))
    props = {p.name: p.value for p in suite.properties()}
    assert props["torch"] == "system"
    assert props["torch.build"].startswith("2.")
    assert props["device"].startswith("cpu")
    assert props["axis.world_size"] == "2" and props["axis.flavor"] == "spicy"
    assert props["demo.ran_in"] == "ws2-plain", "demo depends on world_size only, so ws2-plain ran it for both"


def test_a_hang_is_killed_at_the_deadline_with_every_ranks_stack(finished_run):
    project, _ = finished_run
    case = cases(project)[("ws2-plain", "test_hangs_on_two_ranks")]
    assert case.is_failure
    text = case.result[0].text
    assert "deadline of 4s per test exceeded in cell ws2-plain" in text
    assert "rank 0 Python stacks" in text and "rank 1 Python stacks" in text
    assert "_sleep_forever" in text


def test_the_test_after_the_hang_passes_on_a_rebuilt_pool(finished_run):
    project, _ = finished_run
    assert cases(project)[("ws2-plain", "test_after_the_hang_still_runs")].is_passed
    version_dir = project.root / "out" / "latest" / "torch-system"
    ws2_events = [json.loads(line) for line in (version_dir / "logs" / "ws2.events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in ws2_events].count("pool_start") == 3, (
        "the hang and the exception on rank 1 each forced exactly one rebuild of ws2's pool"
    )
    all_starts = sum(path.read_text().count('"pool_start"') for path in (version_dir / "logs").glob("*.events.jsonl"))
    assert json.loads((version_dir / "plan.json").read_text())["pool_starts"] == all_starts


def test_rank_failure_carries_the_ranks_traceback(finished_run):
    project, _ = finished_run
    case = cases(project)[("ws2-spicy", "test_fails_on_rank_1")]
    assert case.is_failure
    assert "RuntimeError: rank one is unhappy" in case.result[0].text
    assert cases(project)[("ws1-plain", "test_fails_on_rank_1")].is_passed


def test_skips_keep_their_reason(finished_run):
    project, _ = finished_run
    case = cases(project)[("ws1-plain", "test_skips_with_reason")]
    assert case.is_skipped and case.result[0].message == "not applicable to this cell"


def test_recorded_properties_reach_the_cell_report(finished_run):
    project, _ = finished_run
    suite = next(s for s in merged(project) if s.name.endswith("ws1-spicy"))
    props = {p.name: p.value for p in suite.properties()}
    assert props["demo::test_after_the_hang_still_runs::max_abs_diff"] == "0.5"


def test_a_crashed_process_leaves_an_error_with_the_reason_not_a_gap(finished_run):
    project, _ = finished_run
    case = cases(project)[("ws2-spicy", "test_crashes_the_process_for_spicy_ws2")]
    assert case.is_error
    assert "pytest exited with code 3" in case.result[0].message
    assert cases(project)[("ws1-spicy", "test_crashes_the_process_for_spicy_ws2")].is_passed


def test_progress_lines_count_cells(finished_run):
    _, done = finished_run
    assert "[4/4] torch system" in done.stdout
    assert "merged report:" in done.stdout


def test_each_testsuite_is_stamped_when_its_cell_started(finished_run):
    project, _ = finished_run
    stamps = {suite.name.split("/", 1)[1]: suite.timestamp for suite in merged(project)}
    assert stamps["ws2-spicy"] > stamps["ws2-plain"], f"ws2-spicy started after ws2-plain's 4 s hang: {stamps}"


def test_the_run_ends_with_its_root_causes_then_the_command_that_writes_the_summaries(finished_run):
    project, done = finished_run
    run_dir = (project.root / "out" / "latest").resolve()
    lines = done.stdout.splitlines()
    assert lines[-1] == (
        f"torchmatrix: write summary.md and summary.html with `python -m torchmatrix report {run_dir}` "
        f"(or `nox -s report -- {run_dir}`)"
    )
    causes = lines[lines.index("torchmatrix: failures by root cause (3):") + 1 : -1]
    assert any(line.endswith("RuntimeError: rank one is unhappy") for line in causes), causes
