"""The read pass takes nothing from the run directory but data: its interpreters are this machine's
(gpu_matrix's venv of the version, or `--python V=PATH`), its matrix and environment are this
machine's matrix.toml, and a version without an interpreter here is one line, never a traceback.

Interpreters are stand-in shell scripts that record how they were started, so no torch runs.
"""

from __future__ import annotations

import io
import json
import stat
from pathlib import Path

import pytest

from torchmatrix.env.version_venv import VersionVenv, gpu_matrix_python
from torchmatrix.matrix.config import load_matrix
from torchmatrix.run.cross_version import CrossReadError, read_pass

from helpers.matrix_files import write_demo_project

VERSION = "2.13.0"


def recording_interpreter(path: Path, record: Path, exit_code: int = 0) -> Path:
    """An executable that writes its arguments and environment to `record` and exits `exit_code`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "$@" > "{record}"\nenv >> "{record}"\nexit {exit_code}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def hostile_run(root: Path, evil_python: Path) -> Path:
    """A run directory from elsewhere: its plan names `evil_python` and a matrix of its own whose
    `[torch.install."V"].env` would put the artifact's code first on PYTHONPATH."""
    run_dir = root / "artifact" / "run"
    (run_dir / f"torch-{VERSION}").mkdir(parents=True)
    artifact_matrix = run_dir / "matrix.toml"
    artifact_matrix.write_text(
        f'[torch]\nversions = ["{VERSION}"]\n[torch.install."{VERSION}"]\nenv = {{ PYTHONPATH = "{run_dir}" }}\n'
        "[axes]\nworld_size = [1]\n[suites.cross_version]\n"
    )
    plan = {
        "torch": VERSION,
        "cells": ["ws1"],
        "cell_axes": [{"world_size": 1}],
        "environment": {"python": str(evil_python)},
        "matrix": str(artifact_matrix),
        "suites": {"cross_version": {"path": "x.py", "timeout": 60, "axes": []}},
    }
    (run_dir / f"torch-{VERSION}" / "plan.json").write_text(json.dumps(plan))
    return run_dir


@pytest.fixture
def setting(tmp_path):
    """This machine's project (its own matrix) and a hostile run directory whose interpreter leaves a mark."""
    project = write_demo_project(tmp_path / "project", axes={"world_size": [1]}, torch=[VERSION])
    marker = tmp_path / "artifact-code-ran"
    run_dir = hostile_run(tmp_path, recording_interpreter(tmp_path / "artifact" / "python", marker))
    return load_matrix(project / "matrix.toml"), run_dir, marker


def test_the_plans_interpreter_never_runs_and_a_missing_venv_is_one_line(setting, tmp_path):
    matrix, run_dir, marker = setting
    said = io.StringIO()
    assert read_pass(run_dir, matrix, tmp_path / "no-envdir", stream=said) == 0
    assert not marker.exists()
    (line,) = said.getvalue().splitlines()
    assert line.startswith(
        f"torchmatrix: cross-read: torch {VERSION}'s reads of the other versions' checkpoints are not checked: "
    )
    assert "no gpu_matrix venv of it at" in line and "--python 2.13.0=PATH" in line


def test_the_gpu_matrix_venv_reads_with_this_machines_matrix_not_the_artifacts_env(setting, tmp_path):
    matrix, run_dir, marker = setting
    envdir = tmp_path / ".nox"
    record = tmp_path / "venv-ran"
    venv_python = recording_interpreter(gpu_matrix_python(envdir, VERSION), record)
    assert venv_python == VersionVenv(envdir, VERSION, {}).python  # where nox -s gpu_matrix puts it
    assert read_pass(run_dir, matrix, envdir, stream=io.StringIO()) == 0
    assert not marker.exists()
    argv, *environment = record.read_text().splitlines()
    assert f"--config {matrix.path} " in argv and "--cross-version-reads --torch 2.13.0" in argv
    assert not [line for line in environment if line.startswith("PYTHONPATH=") and str(run_dir) in line]


def test_an_explicit_interpreter_wins_and_its_failed_read_is_exit_1(setting, tmp_path):
    matrix, run_dir, marker = setting
    record = tmp_path / "flag-ran"
    python = recording_interpreter(tmp_path / "mine" / "python", record, exit_code=1)
    assert read_pass(run_dir, matrix, tmp_path / "no-envdir", {VERSION: str(python)}, stream=io.StringIO()) == 1
    assert record.exists() and not marker.exists()


def test_a_venv_python_that_is_a_directory_is_one_line(setting, tmp_path):
    matrix, run_dir, _ = setting
    envdir = tmp_path / ".nox"
    gpu_matrix_python(envdir, VERSION).mkdir(parents=True)
    said = io.StringIO()
    assert read_pass(run_dir, matrix, envdir, stream=said) == 0
    assert "no gpu_matrix venv of it at" in said.getvalue() and len(said.getvalue().splitlines()) == 1


def test_a_version_this_matrix_does_not_list_is_not_read(setting, tmp_path):
    _, run_dir, marker = setting
    other = write_demo_project(tmp_path / "other", axes={"world_size": [1]}, torch=["2.14.1"])
    record = tmp_path / "flag-ran"
    python = recording_interpreter(tmp_path / "mine" / "python", record)
    said = io.StringIO()
    matrix = load_matrix(other / "matrix.toml")
    assert read_pass(run_dir, matrix, tmp_path / ".nox", {VERSION: str(python)}, stream=said) == 0
    assert not record.exists() and "2.13.0 is not in [torch].versions of matrix.toml (2.14.1)" in said.getvalue()


def test_a_directory_without_plans_is_refused(setting, tmp_path):
    matrix, _, _ = setting
    (tmp_path / "empty").mkdir()
    with pytest.raises(CrossReadError, match="is not a run directory"):
        read_pass(tmp_path / "empty", matrix, tmp_path / ".nox")


def test_a_truncated_plan_is_exit_2_and_the_other_versions_still_read(setting, tmp_path):
    matrix, run_dir, _ = setting
    (run_dir / "torch-2.12.0").mkdir()
    (run_dir / "torch-2.12.0" / "plan.json").write_text('{"torch": "2.1')
    record = tmp_path / "flag-ran"
    python = recording_interpreter(tmp_path / "mine" / "python", record)
    said = io.StringIO()
    assert read_pass(run_dir, matrix, tmp_path / ".nox", {VERSION: str(python)}, stream=said) == 2
    assert record.exists()
    assert said.getvalue().startswith("torchmatrix: error: cross-read: ") and "not a readable plan" in said.getvalue()


def test_a_paired_run_pairs_cross_version_with_the_versions_named_not_the_matrixs(tmp_path):
    """Bisect's steps pair a release matrix.toml does not list with the baseline: unpaired, that
    release's write would have no reader and skip."""
    from torchmatrix.run.cross_version import suites_for

    write_demo_project(
        tmp_path, torch=[VERSION, "2.15.0"], axes={"world_size": [1]}, suites={"cross_version": {"path": None}}
    )
    matrix = load_matrix(str(tmp_path / "matrix.toml"))
    run_dir = tmp_path / "reports" / "step1"
    unpaired = suites_for(matrix, "2.14.0", run_dir, reads=False)["cross_version"].options
    assert unpaired.peers == ()
    writes = suites_for(matrix, "2.14.0", run_dir, reads=False, paired=(VERSION,))["cross_version"].options
    assert (writes.torch, writes.peers, writes.run_dir) == ("2.14.0", (VERSION,), str(run_dir))
    reads = suites_for(matrix, VERSION, run_dir, reads=True, paired=("2.14.0",))
    assert reads["cross_version"].options.peers == ("2.14.0",)
    assert reads["cross_version"].path.endswith("cross_version_reads.py")
    assert suites_for(matrix, VERSION, run_dir, reads=True)["cross_version"].options.peers == ("2.15.0",)
