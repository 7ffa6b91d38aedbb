"""A run's pytest processes keep their tests' tmp_path folders under torchmatrix's own root
(torchmatrix/ranks/suite_temp_root.py): the user's pytest folders survive the run, whose tests pass."""

from __future__ import annotations

import getpass
import json
import os

import pytest

from torchmatrix.ranks.suite_temp_root import TEMPROOT_VARIABLE

from helpers.matrix_files import matrix_toml
from helpers.projects import Project

pytestmark = pytest.mark.slow

SUITE = """
import json
from pathlib import Path


def test_writes_in_its_tmp_path(cell, tmp_path):
    (tmp_path / "written").write_text("x")
    log = Path(__file__).resolve().parent.parent / "tmp_paths.jsonl"
    with open(log, "a") as out:
        out.write(json.dumps(str(tmp_path)) + "\\n")
"""

USERS_FOLDERS = 6
"""Older numbered folders of the user's own pytest sessions: more than the three newest pytest keeps."""


def test_the_users_pytest_folders_survive_a_run_and_its_tests_write_under_torchmatrixs_root(tmp_path, monkeypatch):
    temp = tmp_path / "temp"
    users = temp / f"pytest-of-{getpass.getuser()}"
    for number in range(USERS_FOLDERS):
        (users / f"pytest-{number}").mkdir(parents=True)
        (users / f"pytest-{number}" / "kept").write_text("the user's")
    monkeypatch.setenv(TEMPROOT_VARIABLE, str(temp))
    project = Project(tmp_path / "project")
    project.write("matrix.toml", matrix_toml(axes={"world_size": [1, 2]}, suites={"tmp": {}}))
    project.write("suites/test_tmp.py", SUITE)

    done = project.torchmatrix("run", "--torch", "system", "--run-id", "r", "--confirm-limit", "0")

    assert done.returncode == 0, done.stdout + done.stderr
    survivors = sorted(path.parent.name for path in users.glob("pytest-*/kept"))
    assert survivors == [f"pytest-{number}" for number in range(USERS_FOLDERS)], survivors
    written = [json.loads(line) for line in (project.root / "tmp_paths.jsonl").read_text().splitlines()]
    assert len(written) == 2, written
    root = temp / f"torchmatrix-of-{getpass.getuser()}"
    assert all(os.path.commonpath([path, root]) == str(root) for path in written), (written, root)
