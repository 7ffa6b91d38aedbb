"""Reliability drills: the real runner on tiny CPU matrices, each cell with one injected fault.

Every drill checks that the run ends within the deadline plus 10 s, that every planned cell is
in the merged report with its true status, that the exit code is non-zero, and that the text
tells a user what happened. The testcase times are the times to detect, quoted in docs/how-to/when-things-go-wrong.md.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest
from junitparser import JUnitXml
from lxml import etree

from helpers.checkout import REPO, checkout_env
from helpers.fake_releases import fake_torch_wheel, offering, torch_site
from helpers.matrix_files import matrix_toml
from helpers.projects import Project

pytestmark = pytest.mark.slow

TIMEOUT_S = 6

FAULTS_MATRIX = matrix_toml(
    axes={
        "world_size": [2],
        "fault": ["none", "collective_hang", "busy_loop", "segfault", "sigkill", "rank_exception"],
    },
    suites={"faults": {"timeout": TIMEOUT_S}},
)

FAULTS_SUITE = """
import ctypes
import os
import signal
import time

import torch
import torch.distributed as dist


def _inject(fault):
    rank = dist.get_rank()
    if fault == "collective_hang":
        if rank == 1:
            time.sleep(3600)
        dist.all_reduce(torch.ones(1))
    elif fault == "busy_loop" and rank == 1:
        while True:
            pass
    elif fault == "segfault" and rank == 1:
        ctypes.string_at(0)
    elif fault == "sigkill" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault == "rank_exception" and rank == 1:
        raise RuntimeError("injected: rank 1 only")
    return rank


def test_fault(cell, ranks):
    assert ranks.run(_inject, cell["fault"]) == [0, 1]


def test_the_pool_works_after_the_fault(cell, ranks):
    assert ranks.run(_inject, "none") == [0, 1]
"""

SCHEMA = etree.XMLSchema(etree.parse(str(REPO / "tests" / "data" / "junit-10.xsd")))


def cases(run_dir) -> dict[tuple[str, str], object]:
    return {
        (suite.name.split("/", 1)[1], case.name.split("[", 1)[0]): case
        for suite in JUnitXml.fromfile(str(run_dir / "junit.xml"))
        for case in suite
    }


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("faults") / "project")
    project.write_suites(FAULTS_MATRIX, test_faults=FAULTS_SUITE)
    started = time.monotonic()
    # Confirmation re-runs are drilled in test_containment.py; here they would only add time.
    done = project.torchmatrix("run", "--torch", "system", "--run-id", "faults", "--confirm-limit", "0")
    return project.root / "reports" / "faults", done, time.monotonic() - started


def test_the_run_fails_and_reports_every_cell(fault_run):
    run_dir, done, _ = fault_run
    assert done.returncode == 1
    found = cases(run_dir)
    faults = ["none", "collective_hang", "busy_loop", "segfault", "sigkill", "rank_exception"]
    assert sorted({cell for cell, _ in found}) == sorted(f"ws2-{f}" for f in faults)
    assert found[("ws2-none", "test_fault")].is_passed
    assert SCHEMA.validate(etree.parse(str(run_dir / "junit.xml"))), SCHEMA.error_log


@pytest.mark.parametrize("fault", ["collective_hang", "busy_loop", "segfault", "sigkill", "rank_exception"])
def test_each_fault_is_detected_within_the_deadline_and_the_next_test_runs(fault_run, fault):
    run_dir, _, _ = fault_run
    found = cases(run_dir)
    case = found[(f"ws2-{fault}", "test_fault")]
    assert case.is_failure
    assert case.time <= TIMEOUT_S + 10, f"{fault} took {case.time:.1f}s to detect"
    assert found[(f"ws2-{fault}", "test_the_pool_works_after_the_fault")].is_passed, "the pool was rebuilt"


def _failure_text(fault_run, fault: str) -> str:
    run_dir, _, _ = fault_run
    return cases(run_dir)[(f"ws2-{fault}", "test_fault")].result[0].text


def test_collective_hang_shows_both_ranks_stacks(fault_run):
    text = _failure_text(fault_run, "collective_hang")
    assert f"deadline of {TIMEOUT_S}s per test exceeded in cell ws2-collective_hang" in text
    rank0, rank1 = text.split("rank 0 Python stacks")[1], text.split("rank 1 Python stacks")[1]
    assert "all_reduce" in rank0.split("rank 1 Python stacks")[0], "rank 0 is shown waiting in the collective"
    assert "_inject" in rank1


def test_busy_loop_shows_where_the_rank_spins(fault_run):
    text = _failure_text(fault_run, "busy_loop")
    assert "deadline of" in text and "_inject" in text.split("rank 1 Python stacks")[1]


def test_segfault_names_the_signal_and_shows_the_crash_dump(fault_run):
    text = _failure_text(fault_run, "segfault")
    assert "rank 1 died with signal SIGSEGV" in text
    assert "Fatal Python error: Segmentation fault" in text


def test_sigkill_names_the_oom_killer(fault_run):
    assert "rank 1 died with signal SIGKILL (as the OOM killer does)" in _failure_text(fault_run, "sigkill")


def test_exception_on_one_rank_carries_its_traceback(fault_run):
    text = _failure_text(fault_run, "rank_exception")
    assert "raised on rank 1" in text and "RuntimeError: injected: rank 1 only" in text


SLOW_MATRIX = matrix_toml(axes={"world_size": [1, 2], "step": [1, 2, 3]}, suites={"slow": {"timeout": 60}})

SLOW_SUITE = """
import socket
import time

import torch.distributed as dist


def _rank():
    return dist.get_rank()


SECONDS = {1: 1.5, 2: 3.0, 3: 60.0}  # step 3 outlasts any delay before the interrupt arrives


def test_takes_a_while(cell, ranks):
    time.sleep(SECONDS[cell["step"]])
    assert ranks.run(_rank) == list(range(cell.world_size))
"""


@pytest.fixture
def slow_project(tmp_path):
    project = Project(tmp_path / "project")
    project.write_suites(SLOW_MATRIX, test_slow=SLOW_SUITE)
    return project


def test_sigint_keeps_finished_cells_and_marks_the_rest_interrupted(slow_project):
    """The runner starts with SIGINT ignored, as a background job of a non-interactive shell does,
    and must still stop on it."""
    runner = subprocess.Popen(
        [sys.executable, "-m", "torchmatrix", "run", "--torch", "system", "--run-id", "interrupted", "--slots", "1"],
        cwd=slow_project.root,
        env=checkout_env(),
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    for line in runner.stdout:
        if line.startswith("[1/6]"):
            break
    interrupted_at = time.monotonic()
    runner.send_signal(signal.SIGINT)
    assert runner.wait(timeout=30) == 130
    assert time.monotonic() - interrupted_at < 10
    run_dir = slow_project.root / "reports" / "interrupted"
    assert SCHEMA.validate(etree.parse(str(run_dir / "junit.xml"))), SCHEMA.error_log
    found = cases(run_dir)
    assert len(found) == 6, "every planned cell is in the report"
    statuses = {cell: ("passed" if case.is_passed else case.result[0].message) for (cell, _), case in found.items()}
    assert "passed" in statuses.values()
    assert any("interrupted" in status for status in statuses.values() if status != "passed"), statuses


def test_two_runs_at_once_with_a_taken_port_stay_apart(slow_project):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 29500))
        taken.listen()
        env = {**checkout_env(), "MASTER_PORT": "29500", "MASTER_ADDR": "127.0.0.1"}
        command = [sys.executable, "-m", "torchmatrix", "run", "--torch", "system", "--slots", "3", "-k", "not 3"]
        runs = [
            subprocess.Popen(command, cwd=slow_project.root, env=env, stdout=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    run_dirs = sorted(p for p in (slow_project.root / "reports").iterdir() if p.is_dir() and not p.is_symlink())
    assert len(run_dirs) == 2, "each run has its own directory"
    for run_dir in run_dirs:
        assert len(cases(run_dir)) == 4
    latest = (slow_project.root / "reports" / "latest").resolve()
    assert latest in run_dirs and len(cases(latest)) == 4


def test_an_unwritable_reports_directory_is_refused_before_any_cell(slow_project):
    slow_project.write("blocked", "a file where the reports directory should be")
    done = slow_project.torchmatrix("run", "--torch", "system", "--reports", "blocked/reports")
    assert done.returncode == 2
    assert done.stderr.startswith("torchmatrix: error: cannot write reports to") and done.stderr.count("\n") == 1
    assert "[1/" not in done.stdout, "no cell ran"


def nox_matrix(version: str) -> str:
    """`version` as the baseline, and a pin no index has."""
    return matrix_toml(
        torch=[version, "9.9.9"], baseline=version, axes={"world_size": [1, 2]}, suites={"slow": {"timeout": 60}}
    )


def test_a_torch_that_does_not_exist_errors_its_cells_and_the_other_version_runs(slow_project, tmp_path):
    """The version that installs is a fake release of this torch (tests/helpers/fake_releases.py):
    nox installs it in seconds instead of unpacking torch again."""
    version = "2.97.0"
    offered = fake_torch_wheel(tmp_path / "releases", version, torch_site())
    slow_project.write("matrix.toml", nox_matrix(version))
    slow_project.write("suites/test_slow.py", SLOW_SUITE.replace('SECONDS[cell["step"]]', "0"))
    env = {
        **offering(offered.parent, checkout_env()),
        "TORCHMATRIX_WHEELHOUSE": str(tmp_path / "wheelhouse"),
        "TORCHMATRIX_CONFIG": str(slow_project.root / "matrix.toml"),
        "TORCHMATRIX_RUN_ID": "nox-drill",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nox",
            "-f",
            str(REPO / "noxfile.py"),
            "--envdir",
            str(tmp_path / "nox"),
            "-s",
            "gpu_matrix",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode != 0
    assert "torch==9.9.9 did not install" in done.stderr
    ran = JUnitXml.fromfile(str(slow_project.root / "reports" / "nox-drill" / "junit.xml"))
    by_version = {suite.name: suite for suite in ran}
    assert sorted(by_version) == sorted(f"torch-{v}/ws{n}" for v in (version, "9.9.9") for n in (1, 2))
    for n in (1, 2):
        assert by_version[f"torch-{version}/ws{n}"].errors == 0 and by_version[f"torch-{version}/ws{n}"].failures == 0
        broken = by_version[f"torch-9.9.9/ws{n}"]
        case = next(iter(broken))
        assert case.is_error and "torch==9.9.9 failed to install" in case.result[0].message
        assert "9.9.9" in case.result[0].text, "pip's own words are in the report"
