"""Hostile and unlucky runs: a test's output, a broken suite, a killed runner, a reused run id.

Each drill runs the real runner on a tiny CPU matrix and checks the exit code, the line a user
reads, that every planned cell is in the merged report, and (for the killed runner) that no
process of the run is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from junitparser import JUnitXml
from lxml import etree

from helpers.checkout import checkout_env
from helpers.matrix_files import matrix_toml
from helpers.processes import processes_with
from helpers.projects import Project

pytestmark = pytest.mark.slow

NOISY_MATRIX = matrix_toml(
    axes={"world_size": [1], "kind": ["a", "b"]}, suites={"noisy": {"timeout": 120}, "broken": {}, "fine": {}}
)

NOISY_SUITE = """
import os
import sys


def test_prints_twelve_megabytes_of_bad_bytes(cell):
    chunk = b"line of output \\xff\\xfe not utf-8 \\x00 nul \\x1b[31m\\n" * 1000
    for _ in range(300):
        os.write(1, chunk)
    sys.stdout.write("THE END\\n")
    sys.stdout.flush()


def test_fails_with_hidden_characters(cell):
    assert False, "evil\\u202egnp.exe\\x1b[2J\\x07 message"
"""

BROKEN_SUITE = "def test_never(cell:\n    pass\n"  # a syntax error

FINE_SUITE = "def test_fine(cell):\n    assert cell.world_size == 1\n"


def _testcases(path: Path) -> dict[tuple[str, str], object]:
    return {(suite.name, case.name): case for suite in JUnitXml.fromfile(str(path)) for case in suite}


@pytest.fixture(scope="module")
def noisy_run(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("noisy") / "project")
    project.write("matrix.toml", NOISY_MATRIX)
    project.write("suites/test_noisy.py", NOISY_SUITE)
    project.write("suites/test_broken.py", BROKEN_SUITE)
    project.write("suites/test_fine.py", FINE_SUITE)
    done = project.torchmatrix(
        "run", "--torch", "system", "--run-id", "noisy", "--output-cap", "200000", "--confirm-limit", "0"
    )
    return done, project.root / "reports" / "noisy"


def test_twelve_megabytes_of_output_leave_a_valid_report_with_head_tail_and_marker(noisy_run):
    done, run_dir = noisy_run
    assert done.returncode == 1, done.stderr
    etree.parse(str(run_dir / "junit.xml"))  # parses without huge_tree: no text node near 10 MB
    cases = _testcases(run_dir / "junit.xml")
    noisy = [case for (_, name), case in cases.items() if name.startswith("test_prints_twelve_megabytes")]
    assert len(noisy) == 2, "one per cell"
    for case in noisy:
        out = case.system_out
        assert len(out.encode()) < 250_000
        assert out.startswith("line of output") and out.rstrip().endswith("THE END")
        assert "torchmatrix dropped " in out and "bytes of output here (--output-cap 200000)" in out
        assert "\\x00 nul" in out and "\\x1b[31m" in out, "NUL and ESC shown as escapes"
        assert "\ufffd" in out, "invalid UTF-8 arrives replaced, not as an unreadable file"
    assert (run_dir.parent / "latest").resolve() == run_dir


def test_bidi_and_control_characters_are_escaped_in_junit(noisy_run):
    _, run_dir = noisy_run
    raw = (run_dir / "junit.xml").read_text(encoding="utf-8")
    assert "\u202e" not in raw and "\x1b" not in raw and "\x07" not in raw
    cases = _testcases(run_dir / "junit.xml")
    failing = [case for (_, name), case in cases.items() if name.startswith("test_fails_with_hidden")]
    assert len(failing) == 2
    for case in failing:
        assert case.result[0].message.startswith("AssertionError: evil\\u202egnp.exe\\x1b[2J\\x07 message")


def test_a_collection_error_errors_only_that_suite(noisy_run):
    _, run_dir = noisy_run
    cases = _testcases(run_dir / "junit.xml")
    by_suite: dict[str, set[str]] = {}
    for case in cases.values():
        status = type(case.result[0]).__name__.lower() if case.result else "passed"
        by_suite.setdefault(case.classname, set()).add(status)
    assert by_suite["broken"] == {"error"}
    assert by_suite["fine"] == {"passed"}, "another suite of the same world size still runs"
    assert {"passed", "failure"} <= by_suite["noisy"]
    broken = next(case for case in cases.values() if case.classname == "broken")
    assert broken.result[0].message == "suite broken could not be collected"
    suites = {suite.name for suite in JUnitXml.fromfile(str(run_dir / "junit.xml"))}
    assert suites == {"torch-system/ws1-a", "torch-system/ws1-b"}, "every planned cell is in the report"


SLOW_MATRIX = matrix_toml(
    axes={"world_size": [2], "speed": ["fast", "slow", "later"]}, suites={"wait": {"timeout": 300}}
)

SLOW_SUITE = """
import time

import torch.distributed as dist


def _rank_waits(seconds):
    time.sleep(seconds)
    dist.barrier()
    return dist.get_rank()


def test_waits(cell, ranks):
    seconds = {"fast": 0.0, "slow": 600.0, "later": 0.0}[cell["speed"]]
    assert ranks.run(_rank_waits, seconds) == [0, 1]
"""


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_sigkilled_runner_leaves_no_process_and_report_rebuilds_every_cell(tmp_path):
    project = Project(tmp_path / "project")
    project.write("matrix.toml", SLOW_MATRIX)
    project.write("suites/test_wait.py", SLOW_SUITE)
    marker = f"TORCHMATRIX_DRILL={uuid.uuid4().hex}"
    name, value = marker.split("=")
    version_dir = project.root / "reports" / "killed" / "torch-system"
    runner = subprocess.Popen(
        [sys.executable, "-m", "torchmatrix", "run", "--torch", "system", "--run-id", "killed"],
        cwd=project.root,
        env={**checkout_env(), name: value},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_for(lambda: (version_dir / "ws2-fast.xml").is_file(), 300, "the first cell's report")
        events = version_dir / "logs" / "ws2.events.jsonl"
        _wait_for(lambda: '"cell": "ws2-slow"' in events.read_text(), 120, "the slow cell to start")
        time.sleep(1.0)  # its ranks are inside the test now
        assert len(processes_with(marker)) >= 5, "runner, pytest, zygote and two ranks were running"
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait()
        _wait_for(lambda: not processes_with(marker), 30, "every process of the run to exit")
    finally:
        for pid in processes_with(marker):
            os.kill(pid, signal.SIGKILL)
    assert processes_with(marker) == []
    assert (version_dir / "ws2-fast.xml").is_file(), "the finished cell was written as it finished"
    assert not (version_dir / "ws2-later.xml").exists()
    done = project.torchmatrix("report", str(project.root / "reports" / "killed"))
    assert done.returncode == 0, done.stderr
    cases = _testcases(project.root / "reports" / "killed" / "junit.xml")
    statuses = {suite.split("/")[1]: case for (suite, _), case in cases.items()}
    assert set(statuses) == {"ws2-fast", "ws2-slow", "ws2-later"}, "every planned cell is in the report"
    assert statuses["ws2-fast"].is_passed
    for cell in ("ws2-slow", "ws2-later"):
        assert "the runner stopped before this suite finished" in statuses[cell].result[0].message


def tiny_matrix(world_sizes=(1,)) -> str:
    return matrix_toml(axes={"world_size": list(world_sizes)}, suites={"fine": {}})


def test_a_reused_run_id_is_refused_and_restart_starts_clean(tmp_path):
    project = Project(tmp_path / "project")
    project.write("matrix.toml", tiny_matrix())
    project.write("suites/test_fine.py", FINE_SUITE)
    first = project.torchmatrix("run", "--torch", "system", "--run-id", "again")
    assert first.returncode == 0, first.stderr
    events = project.root / "reports" / "again" / "torch-system" / "logs" / "ws1.events.jsonl"
    events.write_text(events.read_text() + '{"event": "test", "stale": true}\n')
    second = project.torchmatrix("run", "--torch", "system", "--run-id", "again")
    assert second.returncode == 2
    assert second.stderr.strip().splitlines() == [
        f"torchmatrix: error: {project.root / 'reports' / 'again' / 'torch-system'} already holds a run (found plan.json); "
        "pass a new --run-id, or --restart to delete it and start clean"
    ]
    third = project.torchmatrix("run", "--torch", "system", "--run-id", "again", "--restart")
    assert third.returncode == 0, third.stderr
    assert "stale" not in events.read_text()
    assert len(_testcases(project.root / "reports" / "again" / "junit.xml")) == 1


def test_a_world_size_beyond_the_cpu_limit_is_refused_unless_allowed(tmp_path):
    project = Project(tmp_path / "project")
    project.write("matrix.toml", tiny_matrix(world_sizes=(1, 10000)))
    project.write("suites/test_fine.py", FINE_SUITE)
    done = project.torchmatrix("run", "--torch", "system", "--run-id", "wide")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "torchmatrix: error: world size 10000 needs 10000 rank processes on this CPU-only machine, above the limit of 64; "
        "narrow the selection (--only world_size=...) or pass --max-cpu-ranks 10000"
    ]
    narrowed = project.torchmatrix("run", "--torch", "system", "--run-id", "narrow", "--only", "world_size=1")
    assert narrowed.returncode == 0, narrowed.stderr
