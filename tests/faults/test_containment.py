"""Containment drill: one real failure stays one failure, and its root cause is on the page.

A world-size-2 cell whose first test hangs in mismatched collectives (rank 0 in `barrier`, rank 1
in `all_gather_object`) past its deadline, whose second test
raises on one rank only (a chained exception), and then four healthy collective tests. A second
suite has a test that fails only after another test of its process ran. The real runner, the
real report, and every failure re-run alone.
"""

from __future__ import annotations

import html
import json
import os
import re
import time
import uuid
from pathlib import Path

import pytest
from junitparser import JUnitXml

from helpers.matrix_files import matrix_toml
from helpers.processes import processes_with
from helpers.projects import Project

pytestmark = pytest.mark.slow

DEADLINE_S = 10
"""Short, since the hang waits it out twice (the run, the re-run alone): that the process group's timeout
outlasts any deadline, 300 s among them, is tests/ranks/test_pool.py::test_the_process_group_outlives_any_deadline's."""

MATRIX = matrix_toml(
    axes={"world_size": [2]},
    suites={"drill": {"timeout": DEADLINE_S}, "order": {"timeout": 30}},
)

DRILL_SUITE = """
import torch
import torch.distributed as dist


def _mismatched():
    if dist.get_rank() == 0:
        dist.barrier()
    else:
        dist.all_gather_object([None, None], "rank 1")


def _raise_on_rank_1():
    if dist.get_rank() == 1:
        try:
            raise ValueError("the innermost cause: rank 1 only")
        except ValueError as cause:
            raise RuntimeError("a wrapper that hides the cause") from cause
    dist.barrier()


def _all_reduce():
    value = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(value)
    return value.item()


def _all_gather():
    gathered = [None, None]
    dist.all_gather_object(gathered, dist.get_rank())
    return gathered


def _broadcast():
    value = torch.tensor([float(dist.get_rank())])
    dist.broadcast(value, src=1)
    return value.item()


def _barrier():
    dist.barrier()
    return dist.get_rank()


def test_1_mismatched_collectives(cell, ranks):
    ranks.run(_mismatched)


def test_2_raises_on_one_rank(cell, ranks):
    ranks.run(_raise_on_rank_1)


def test_3_all_reduce(cell, ranks):
    assert ranks.run(_all_reduce) == [3.0, 3.0]


def test_4_all_gather_object(cell, ranks):
    assert ranks.run(_all_gather) == [[0, 1], [0, 1]]


def test_5_broadcast(cell, ranks):
    assert ranks.run(_broadcast) == [1.0, 1.0]


def test_6_barrier(cell, ranks):
    assert ranks.run(_barrier) == [0, 1]
"""

ORDER_SUITE = """
import torch.distributed as dist

ran = []


def _rank():
    return dist.get_rank()


def test_a_leaves_state_behind(cell, ranks):
    ran.append("a")
    assert ranks.run(_rank) == [0, 1]


def test_b_fails_only_after_another_test(cell, ranks):
    assert ranks.run(_rank) == [0, 1]
    assert not ran, f"state left by an earlier test of this process: {ran}"
"""


def _left_behind(marker: str, settle_s: float = 10.0) -> list[str]:
    """Command lines of the run's processes still alive once those on their way out had `settle_s`."""
    deadline = time.monotonic() + settle_s
    while (pids := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = []
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            left.append(f"{pid}: {command}")
        except OSError:
            continue
    return left


@pytest.fixture(scope="module")
def drill(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("containment") / "project")
    project.write_suites(MATRIX, test_drill=DRILL_SUITE, test_order=ORDER_SUITE)
    marker = f"TORCHMATRIX_DRILL={uuid.uuid4().hex}"
    os.environ[marker.split("=")[0]] = marker.split("=")[1]
    try:
        done = project.torchmatrix("run", "--torch", "system", "--run-id", "drill")
    finally:
        del os.environ[marker.split("=")[0]]
    left = _left_behind(marker)
    run_dir = project.root / "reports" / "drill"
    report = project.torchmatrix("report", str(run_dir))
    assert report.returncode == 0, report.stderr
    return run_dir, done, left


def _cases(run_dir: Path) -> dict[str, object]:
    return {
        case.name.split("[", 1)[0]: case for suite in JUnitXml.fromfile(str(run_dir / "junit.xml")) for case in suite
    }


def _records(run_dir: Path) -> dict[str, dict]:
    return {record["test"]: record for record in json.loads((run_dir / "results.json").read_text())["tests"]}


def test_exactly_the_two_broken_tests_fail_and_the_four_after_them_pass(drill):
    run_dir, done, _ = drill
    assert done.returncode == 1, done.stdout + done.stderr
    cases = _cases(run_dir)
    assert cases["test_1_mismatched_collectives"].is_failure
    assert cases["test_2_raises_on_one_rank"].is_failure
    for healthy in ("test_3_all_reduce", "test_4_all_gather_object", "test_5_broadcast", "test_6_barrier"):
        assert cases[healthy].is_passed, f"{healthy}: {cases[healthy].result[0].message}"


def test_the_hang_ends_with_the_deadline_and_both_ranks_stacks(drill):
    run_dir, _, _ = drill
    failure = _cases(run_dir)["test_1_mismatched_collectives"].result[0]
    assert failure.message.startswith(f"deadline of {DEADLINE_S}s per test exceeded: ranks 0, 1 did not finish")
    rank0 = failure.text.split("---- rank 0 Python stacks ----")[1].split("---- rank 1")[0]
    rank1 = failure.text.split("---- rank 1 Python stacks ----")[1]
    assert "in barrier" in rank0 and "_mismatched" in rank0
    assert "in all_gather_object" in rank1 and "_mismatched" in rank1
    assert "Timed out waiting" not in failure.text, "gloo's own timeout must not fire before the deadline"


def test_the_chained_exception_shows_its_innermost_line_everywhere(drill):
    run_dir, _, _ = drill
    line = "ValueError: the innermost cause: rank 1 only"
    assert _cases(run_dir)["test_2_raises_on_one_rank"].result[0].message == line
    assert _records(run_dir)["test_2_raises_on_one_rank"]["message"] == line
    headings = [text for text in (run_dir / "summary.md").read_text().splitlines() if text.startswith("#### ")]
    assert any(re.fullmatch(rf"#### \d+\. `{re.escape(line)}`", heading) for heading in headings), headings
    assert f"<h3><code>{html.escape(line)}</code></h3>" in (run_dir / "summary.html").read_text()


def test_every_failure_is_confirmed_alone(drill):
    run_dir, done, _ = drill
    records = _records(run_dir)
    assert records["test_1_mismatched_collectives"]["confirmation"] == "fails alone"
    assert records["test_2_raises_on_one_rank"]["confirmation"] == "fails alone"
    assert records["test_3_all_reduce"]["confirmation"] == "", "passing tests are not re-run"
    assert "re-running 3 failed tests alone" in done.stdout
    assert "2 of 3 fail alone, 1 passed alone" in done.stdout
    assert (
        "Every failing test was re-run alone in a fresh process: 2 fail alone (a behaviour of that torch), "
        "1 passed alone (order-dependent or flaky)." in (run_dir / "summary.md").read_text()
    )


def test_a_test_that_fails_only_after_another_is_marked_order_dependent(drill):
    run_dir, _, _ = drill
    record = _records(run_dir)["test_b_fails_only_after_another_test"]
    assert record["status"] == "failed" and record["confirmation"] == "passed alone"
    summary = (run_dir / "summary.md").read_text()
    assert "passed alone (order-dependent or flaky)" in summary
    suites = re.search(r"One mark per suite, in this order: (.+?)\. ", summary).group(1).replace("`", "").split(", ")
    marks = next(line for line in summary.splitlines() if line.startswith("| `ws2`")).split("|")[2].strip()
    expected = {"drill": "❌", "order": "⚠️"}
    assert marks == "".join(expected[suite] for suite in suites), "order is order-dependent, not red; drill is red"
    page = (run_dir / "summary.html").read_text()
    assert '<a class="mark order-dependent" title="order: failed"' in page
    assert '<a class="mark failed" title="drill: failed"' in page


def test_rebuilds_and_confirmations_leave_no_process_behind(drill):
    _, _, left = drill
    assert left == [], f"processes of the run still alive: {left}"
