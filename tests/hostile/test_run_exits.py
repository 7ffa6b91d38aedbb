"""Unlucky runs of round 3: a suite that collects nothing, processes a test leaves behind, a
second runner or a `report` on a running run, signals during the checks and in the cleanup, a
full disk, a test that removes the reports, and a reports/latest that is a directory.

Each drill runs the real runner on a tiny CPU matrix and checks the exit code, the line a user
reads, that every planned cell is in the report, and that no process of the run is left,
counted by process group and session (not by name).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchmatrix.reports.confirmation_notes import INTERRUPTED
from torchmatrix.status import Confirmation

from helpers.checkout import checkout_env
from helpers.matrix_files import matrix_toml
from helpers.projects import Project
from helpers.run_results import cell_failures, cell_outcomes

pytestmark = pytest.mark.slow

LEFTOVERS_SUITE = """
import os
import subprocess


def _spawn(where, *, own_session=False):
    child = subprocess.Popen(["sleep", "300"], start_new_session=own_session)
    with open(os.environ["TORCHMATRIX_SPAWNED"], "a") as spawned:
        spawned.write(f"{where} {child.pid} {os.getpgid(child.pid)} {os.getsid(child.pid)}\\n")
    return child.pid


def test_leaves_children(cell, ranks):
    _spawn("pytest")
    _spawn("pytest-setsid", own_session=True)
    ranks.run(_spawn, "rank")
"""

TYPO_SUITE = "def check_typo(cell):\n    pass\n"  # a `check_` prefix: pytest collects nothing
SELF_SKIP_SUITE = "import pytest\n\npytest.importorskip('no_such_package_here')\n\n\ndef test_x(cell):\n    pass\n"
FINE_SUITE = "def test_fine(cell):\n    pass\n"
LAMBDA_SUITE = "def test_sends_a_lambda(cell, ranks):\n    ranks.run(lambda: 1)\n"


def _groups_alive(pgids: set[int], sids: set[int]) -> list[str]:
    """Live processes (not zombies) whose process group or session is one of these."""
    alive = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and (int(fields[2]) in pgids or int(fields[3]) in sids):
            alive.append(f"{entry.name} (pgid {fields[2]}, sid {fields[3]})")
    return alive


@pytest.fixture(scope="module")
def leftovers_run(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("leftovers") / "project")
    project.write(
        "matrix.toml",
        matrix_toml(
            axes={"world_size": [1]}, suites={"leftovers": {}, "typo": {}, "selfskip": {}, "fine": {}, "lambdas": {}}
        ),
    )
    project.write("suites/test_leftovers.py", LEFTOVERS_SUITE)
    project.write("suites/test_typo.py", TYPO_SUITE)
    project.write("suites/test_selfskip.py", SELF_SKIP_SUITE)
    project.write("suites/test_fine.py", FINE_SUITE)
    project.write("suites/test_lambdas.py", LAMBDA_SUITE)
    (project.root / "reports" / "latest").mkdir(parents=True)  # a downloaded artifact unpacked there
    spawned = project.root / "spawned.txt"
    done = subprocess.run(
        [sys.executable, "-m", "torchmatrix", "run", "--torch", "system", "--run-id", "one", "--confirm-limit", "0"],
        cwd=project.root,
        env={**checkout_env(), "TORCHMATRIX_SPAWNED": str(spawned)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    rows = [line.split() for line in spawned.read_text().splitlines()]
    yield done, project, rows
    for _, pid, _, _ in rows:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_no_process_a_test_started_outlives_the_run(leftovers_run):
    done, _, rows = leftovers_run
    assert sorted(row[0] for row in rows) == ["pytest", "pytest-setsid", "rank"], done.stderr
    pgids, sids = {int(row[2]) for row in rows}, {int(row[3]) for row in rows}
    assert _groups_alive(pgids, sids) == [], "a child of the pytest process or of a rank is still running"


def test_a_suite_that_collects_nothing_errors_naming_the_prefix(leftovers_run):
    done, project, _ = leftovers_run
    assert done.returncode == 1, done.stderr
    outcomes = cell_outcomes(project.root / "reports" / "one" / "torch-system")
    assert outcomes["ws1"] == {
        "test_leaves_children": "passed",
        "typo": "error",
        "selfskip": "skipped",
        "test_fine": "passed",
        "test_sends_a_lambda": "failure",
    }
    assert "suite typo collected no test from suites/test_typo.py: pytest runs functions named test_*" in done.stdout


def test_a_latest_directory_is_left_alone_with_a_warning(leftovers_run):
    done, project, _ = leftovers_run
    reports = project.root / "reports"
    assert "Traceback" not in done.stderr
    assert f"torchmatrix: warning: {reports / 'latest'} is not the link torchmatrix keeps" in done.stderr
    assert (reports / "latest").is_dir() and not (reports / "latest").is_symlink()
    assert sorted(p.name for p in reports.iterdir()) == ["latest", "one"], "no .latest-<pid> left behind"


GATED_SUITE = """
import os
import time


def test_waits_for_release(cell):
    release = os.environ["TORCHMATRIX_RELEASE"]
    deadline = time.monotonic() + 240
    while not os.path.exists(release):
        assert time.monotonic() < deadline, "never released"
        time.sleep(0.1)


def test_after(cell):
    pass


def test_last(cell):
    pass
"""


def _gated_project(root: Path) -> Project:
    project = Project(root)
    project.write("matrix.toml", matrix_toml(axes={"world_size": [1]}, suites={"gated": {}}))
    project.write("suites/test_gated.py", GATED_SUITE)
    return project


def _start(project: Project, run_id: str, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "torchmatrix", "run", "--torch", "system", "--run-id", run_id, *extra],
        cwd=project.root,
        env={**checkout_env(), "TORCHMATRIX_RELEASE": str(project.root / "release"), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _signalled(runner: subprocess.Popen, ready, what: str, *signums: int) -> tuple[str, str]:
    """The runner's output after `signums` (0.05 s apart) once `ready()` holds; killed if it outlives that."""
    try:
        _wait_for(ready, 240, what)
        for index, signum in enumerate(signums):
            time.sleep(0.05 if index else 0)
            runner.send_signal(signum)
        return runner.communicate(timeout=120)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _test_started(project: Project, run_id: str) -> bool:
    events = project.root / "reports" / run_id / "torch-system" / "logs" / "ws1.events.jsonl"
    return events.is_file() and '"event": "start"' in events.read_text()


def test_a_second_runner_and_a_report_during_the_run_are_refused(tmp_path):
    project = _gated_project(tmp_path / "project")
    first = _start(project, "same")
    try:
        _wait_for(lambda: _test_started(project, "same"), 240, "the first runner's test to start")
        second = _start(project, "same")
        _, err = second.communicate(timeout=240)
        assert second.returncode == 2, err
        assert err.strip().splitlines() == [err.strip()] and err.startswith("torchmatrix: error: "), err
        assert f"is being written by another run (pid {first.pid} on " in err and "pass another --run-id" in err
        early = project.torchmatrix("report", "reports/same")
        assert early.returncode == 2, early.stderr
        assert f"is still being run (pid {first.pid} on " in early.stderr and "Traceback" not in early.stderr
        (project.root / "release").touch()
        out, err = first.communicate(timeout=240)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 0, err
    assert cell_outcomes(project.root / "reports" / "same" / "torch-system") == {
        "ws1": {"test_waits_for_release": "passed", "test_after": "passed", "test_last": "passed"}
    }, "each testcase once"
    later = project.torchmatrix("report", "reports/same")
    assert later.returncode == 0, later.stderr
    assert "torchmatrix: 3 passed" in later.stdout, later.stdout


def test_two_quick_interrupts_keep_every_test_of_the_cell(tmp_path):
    project = _gated_project(tmp_path / "project")
    runner = _start(project, "twice")
    out, err = _signalled(
        runner, lambda: _test_started(project, "twice"), "the test to start", signal.SIGINT, signal.SIGINT
    )
    assert runner.returncode == 130, err
    assert "Traceback" not in err
    assert cell_outcomes(project.root / "reports" / "twice" / "torch-system") == {
        "ws1": {"test_waits_for_release": "error", "test_after": "error", "test_last": "error"}
    }
    assert "torchmatrix: torch system: 0 passed, 0 failed, 3 errors, 0 skipped;" in out, (
        "the tally is what the XML holds"
    )


FAILS_THEN_WAITS_ALONE = """
import os
import time


def test_fails_then_waits_alone(cell):
    first_run = os.environ["TORCHMATRIX_FIRST_RUN"]
    if os.path.exists(first_run):
        open(os.environ["TORCHMATRIX_RERUN_STARTED"], "w").close()
        time.sleep(120)
    open(first_run, "w").close()
    raise AssertionError("fails in the run")
"""


def test_a_signal_during_the_reruns_alone_notes_the_unconfirmed_failure_as_stopped(tmp_path):
    project = Project(tmp_path / "project")
    project.write("matrix.toml", matrix_toml(axes={"world_size": [1]}, suites={"waits": {}}))
    project.write("suites/test_waits.py", FAILS_THEN_WAITS_ALONE)
    started = project.root / "rerun-started"
    env = {"TORCHMATRIX_FIRST_RUN": str(project.root / "first-run"), "TORCHMATRIX_RERUN_STARTED": str(started)}
    runner = _start(project, "stopped", env=env)
    _, err = _signalled(runner, started.exists, "the re-run alone to start", signal.SIGTERM)
    assert runner.returncode == 130, err
    assert project.torchmatrix("report", "reports/stopped").returncode in (0, 1)
    [test] = json.loads((project.root / "reports" / "stopped" / "results.json").read_text())["tests"]
    assert test["status"] == "failed", test
    assert (test["confirmation"], test["confirmation_note"]) == (Confirmation.NOT_RERUN, INTERRUPTED), test


SLOW_COMPONENT = """
import os
import time

open(os.environ["TORCHMATRIX_CHECKING"], "w").close()
time.sleep(120)


def build_model(cell):
    raise AssertionError("never built")
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_the_component_check_exits_130_with_every_cell_reported(tmp_path, signum):
    project = Project(tmp_path / "project")
    project.write(
        "matrix.toml",
        matrix_toml(
            axes={"world_size": [1, 2]}, suites={"fine": {}}, components={"model": "slow_component:build_model"}
        ),
    )
    project.write("suites/test_fine.py", FINE_SUITE)
    project.write("slow_component.py", SLOW_COMPONENT)
    checking = project.root / "checking"
    runner = _start(
        project,
        "early",
        env={
            "TORCHMATRIX_CHECKING": str(checking),
            "PYTHONPATH": f"{project.root}{os.pathsep}{checkout_env()['PYTHONPATH']}",
        },
    )
    out, err = _signalled(runner, checking.exists, "the component check to import the component", signum)
    assert runner.returncode == 130, err
    assert "Traceback" not in err, err
    report = project.torchmatrix("report", "reports/early")
    assert report.returncode == 0, report.stderr
    outcomes = cell_outcomes(project.root / "reports" / "early" / "torch-system")
    assert outcomes == {"ws1": {"fine": "error"}, "ws2": {"fine": "error"}}, "every planned cell is in the report"


FILLS_DISK_SUITE = """
import os
import time


def test_fills_the_disk(cell):
    if cell["kind"] != "filler":
        return
    reports = os.environ["TORCHMATRIX_REPORTS"]
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(reports, "full", "torch-system", "ws1-first.xml")):
        assert time.monotonic() < deadline, "the first cell's report was never written"
        time.sleep(0.05)
    with open(os.path.join(os.environ["TORCHMATRIX_REPORTS"], "filler"), "wb") as filler:
        try:
            while True:
                filler.write(b"x" * 4096)
                filler.flush()
        except OSError:
            pass
"""


def _can_mount_tmpfs() -> bool:
    return shutil.which("unshare") is not None and (
        subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "tmpfs", "/mnt"], capture_output=True).returncode == 0
    )


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs `unshare -rm` to mount a small tmpfs")
def test_a_full_disk_keeps_the_finished_cells_and_names_the_full_disk(tmp_path):
    project = Project(tmp_path / "project")
    project.write(
        "matrix.toml", matrix_toml(axes={"world_size": [1], "kind": ["first", "filler"]}, suites={"fills": {}})
    )
    project.write("suites/test_fills.py", FILLS_DISK_SUITE)
    reports = project.root / "reports"
    reports.mkdir()
    command = [sys.executable, "-m", "torchmatrix", "run", "--torch", "system", "--run-id", "full", "--slots", "1"]
    script = f"mount -t tmpfs -o size=256k tmpfs {reports} && exec {' '.join(command)}; "
    script += f"code=$?; ls -A {reports}/full/torch-system > {tmp_path}/listing; cat {reports}/full/torch-system/ws1-first.xml > {tmp_path}/first.xml; exit $code"
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script.replace("exec ", "")],
        cwd=project.root,
        env={**checkout_env(), "TORCHMATRIX_REPORTS": str(reports)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("torchmatrix: error: cannot write the reports of torch system to ")
    assert (
        "No space left on device: the disk is full" in lines[0] and "the reports of finished cells are kept" in lines[0]
    )
    listing = (tmp_path / "listing").read_text().split()
    assert "ws1-first.xml" in listing and not [name for name in listing if name.endswith(".partial")], listing
    assert "test_fills_the_disk[torch=system,ws1-first]" in (tmp_path / "first.xml").read_text()


REMOVES_REPORTS_SUITE = """
import os
import shutil


def test_removes_the_reports(cell):
    if cell["kind"] == "remover":
        shutil.rmtree(os.environ["TORCHMATRIX_REPORTS"])
"""


def test_a_test_that_removes_the_reports_directory_leaves_a_full_report(tmp_path):
    project = Project(tmp_path / "project")
    project.write(
        "matrix.toml",
        matrix_toml(axes={"world_size": [1], "kind": ["remover", "after"]}, suites={"removes": {}}),
    )
    project.write("suites/test_removes.py", REMOVES_REPORTS_SUITE)
    reports = project.root / "reports"
    runner = _start(project, "removed", "--slots", "1", env={"TORCHMATRIX_REPORTS": str(reports)})
    out, err = runner.communicate(timeout=600)
    assert "Traceback" not in err, err
    assert runner.returncode == 1, err
    outcomes = cell_outcomes(reports / "removed" / "torch-system")
    assert set(outcomes) == {"ws1-remover", "ws1-after"}, "every planned cell is in the report"
    assert (reports / "latest").resolve() == reports / "removed"


def test_a_lambda_sent_to_the_ranks_is_named(leftovers_run):
    _, project, _ = leftovers_run
    failure = cell_failures(project.root / "reports" / "one" / "torch-system")["ws1"]["test_sends_a_lambda"]
    assert "cannot send 'test_sends_a_lambda.<locals>.<lambda>' to the ranks" in failure, failure


STOPPING_SUITE = """
import pytest


def test_first(cell):
    pass


def test_stops(cell):
    if cell["stop"] == "exit":
        pytest.exit("leaving early", returncode=0)
    raise KeyboardInterrupt
"""


def test_a_test_that_exits_or_interrupts_pytest_as_the_last_of_its_cell_is_an_error(tmp_path):
    """pytest.exit() (exit code 0) and KeyboardInterrupt, each as the last test of its cell: an
    error naming what stopped it, exit 1, never "passed"."""
    project = Project(tmp_path / "project")
    project.write(
        "matrix.toml",
        matrix_toml(
            axes={"world_size": [1, 2], "stop": ["exit", "interrupt"]},
            exclude=[{"world_size": 1, "stop": "interrupt"}, {"world_size": 2, "stop": "exit"}],
            suites={"stopping": {}},
        ),
    )
    project.write("suites/test_stopping.py", STOPPING_SUITE)
    done = project.torchmatrix("run", "--torch", "system", "--run-id", "stops", "--confirm-limit", "0")
    assert done.returncode == 1, done.stdout + done.stderr
    version_dir = project.root / "reports" / "stops" / "torch-system"
    assert cell_outcomes(version_dir) == {
        "ws1-exit": {"test_first": "passed", "test_stops": "error"},
        "ws2-interrupt": {"test_first": "passed", "test_stops": "error"},
    }
    assert "Exit: leaving early stopped the pytest session" in (version_dir / "ws1-exit.xml").read_text()
    assert "KeyboardInterrupt stopped the pytest session" in (version_dir / "ws2-interrupt.xml").read_text()


BLOCKS_AT_IMPORT_SUITE = """
import threading

threading.Event().wait()  # blocks_the_import_forever


def test_never_reached(cell):
    pass
"""

LEAVES_A_THREAD_SUITE = """
import threading
import time


def _keeps_the_process_alive():
    while True:
        time.sleep(0.1)


def test_leaves_a_thread(cell):
    threading.Thread(target=_keeps_the_process_alive).start()
"""


def _errors(version_dir: Path) -> dict[str, str]:
    """Test name -> error message and text, over every cell report of the version."""
    from junitparser import Error, JUnitXml

    from torchmatrix.reports.junit import test_of_testcase

    return {
        test_of_testcase(case.name): f"{case.result[0].message or ''}\n{case.result[0].text or ''}"
        for report in sorted(version_dir.glob("*.xml"))
        for suite in JUnitXml.fromfile(str(report))
        for case in suite
        if case.result and isinstance(case.result[0], Error)
    }


@pytest.mark.parametrize(
    "suite, says, held_by",
    [
        (BLOCKS_AT_IMPORT_SUITE, "the pytest process had not collected its tests", "test_held.py"),
        (LEAVES_A_THREAD_SUITE, "the pytest process did not exit 30s after its last test", "_keeps_the_process_alive"),
    ],
    ids=["blocks-at-import", "leaves-a-thread"],
)
def test_a_pytest_process_that_does_not_collect_or_exit_is_killed_with_its_stacks(tmp_path, suite, says, held_by):
    """A 2 s deadline per test: the run ends (the suite's deadline plus 60 s to collect, 30 s to exit
    after the last test), and the cell errors with the reason and the stack of what held the process."""
    project = Project(tmp_path / "project")
    project.write("matrix.toml", matrix_toml(axes={"world_size": [1]}, suites={"held": {"timeout": 2}}))
    project.write("suites/test_held.py", suite)
    started = time.monotonic()
    done = project.torchmatrix("run", "--torch", "system", "--run-id", "r", "--confirm-limit", "0", timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert time.monotonic() - started < 150
    errors = _errors(project.root / "reports" / "r" / "torch-system")
    assert len(errors) == 1, errors
    (text,) = errors.values()
    assert says in text, text
    assert "Python stacks of the pytest process:" in text and held_by in text.split("Python stacks")[1], text
