"""Unlucky runs of round 3: a suite that collects nothing, processes a test leaves behind, a
second runner or a `report` on a running run, signals during the checks and in the cleanup, a
full disk, a test that removes the reports, and a reports/latest that is a directory.

Each drill runs the real runner on a tiny CPU matrix and checks the exit code, the line a user
reads, that every planned cell is in the report, and that no process of the run is left,
counted by process group and session (not by name).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import Project, cell_outcomes, checkout_env, matrix_toml

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
        matrix_toml(axes={"world_size": [1]}, suites={"leftovers": {}, "typo": {}, "selfskip": {}, "fine": {}}),
    )
    project.write("suites/test_leftovers.py", LEFTOVERS_SUITE)
    project.write("suites/test_typo.py", TYPO_SUITE)
    project.write("suites/test_selfskip.py", SELF_SKIP_SUITE)
    project.write("suites/test_fine.py", FINE_SUITE)
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
    assert outcomes["ws1"] == {"test_leaves_children": "passed", "typo": "error", "selfskip": "skipped", "test_fine": "passed"}
    assert "suite typo collected no test from suites/test_typo.py: pytest runs functions named test_*" in done.stdout


def test_a_latest_directory_is_left_alone_with_a_warning(leftovers_run):
    done, project, _ = leftovers_run
    reports = project.root / "reports"
    assert "Traceback" not in done.stderr
    assert f"torchmatrix: warning: {reports / 'latest'} is not the link torchmatrix keeps" in done.stderr
    assert (reports / "latest").is_dir() and not (reports / "latest").is_symlink()
    assert sorted(p.name for p in reports.iterdir()) == ["latest", "one"], "no .latest-<pid> left behind"
