"""Run directories from elsewhere (a CI artifact, an unpacked tarball, a shared file system) stay
data: a symlink or a pipe in one is refused with one line, and nothing outside the run directory is
deleted, copied, read through or waited on because of what the directory holds.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.checkout import PROJECT_IS_THIS_CHECKOUT, checkout_env
from helpers.matrix_files import REFERENCE_COMPONENTS, matrix_toml
from helpers.projects import Project
from helpers.report_runs import CANDIDATE, write_fixture_run, write_project

VERSION = "2.13.0"
CELL_AXES = {"world_size": 1, "fsdp": "none", "attn": "sdpa", "optimizer": "adamw"}
CELL_ID = "ws1-none-sdpa-adamw"
CROSS_MATRIX = (
    matrix_toml(
        torch=[VERSION],
        axes={key: [value] for key, value in CELL_AXES.items()},
        suites={"cross_version": {"path": None}},
        components=REFERENCE_COMPONENTS,
    )
    + PROJECT_IS_THIS_CHECKOUT
)


def _cross_version_plan(project: Project) -> dict:
    from torchmatrix.matrix.config import load_matrix

    suites = {"cross_version": {"path": "cross_version.py", "timeout": 60, "axes": []}}
    digest = load_matrix(project.root / "matrix.toml").digest
    return {"torch": VERSION, "matrix_sha256": digest, "cells": [CELL_ID], "cell_axes": [CELL_AXES], "suites": suites}


def _precious(directory: Path) -> Path:
    """A directory outside the project holding a file and a folder, standing in for ~/work."""
    (directory / "folder").mkdir(parents=True)
    (directory / "folder" / "kept.txt").write_text("precious\n")
    (directory / "kept.txt").write_text("precious\n")
    return directory


@pytest.mark.parametrize("linked", ["reads", "reads/logs"])
def test_cross_read_refuses_a_linked_reads_folder_and_deletes_nothing_it_points_to(tmp_path, linked):
    project = Project(tmp_path / "project")
    project.write("matrix.toml", CROSS_MATRIX)
    version_dir = project.root / "reports" / "r" / f"torch-{VERSION}"
    project.write(f"reports/r/torch-{VERSION}/plan.json", json.dumps(_cross_version_plan(project)))
    (version_dir / linked).parent.mkdir(parents=True, exist_ok=True)
    outside = _precious(tmp_path / "outside")
    (version_dir / linked).symlink_to(outside)
    done = project.torchmatrix("cross-read", "reports/r", "--python", f"{VERSION}={sys.executable}")
    assert sorted(p.relative_to(outside).as_posix() for p in outside.rglob("*")) == [
        "folder",
        "folder/kept.txt",
        "kept.txt",
    ]
    assert done.returncode == 2, done.stderr
    assert f"{version_dir / linked} is a symlink to {outside}, not a folder of the run" in done.stderr
    assert "Traceback" not in done.stderr


SYSTEM_MATRIX = '[torch]\nversions = ["system"]\n[axes]\nworld_size = [1]\n[suites.s]\npath = "suites/test_s.py"\n'


@pytest.fixture(scope="module")
def shard_run(tmp_path_factory) -> Path:
    """One real run of torch `system` (a shard as CI would upload it), copied by each test."""
    project = Project(tmp_path_factory.mktemp("shard") / "project")
    project.write("matrix.toml", SYSTEM_MATRIX)
    project.write("suites/test_s.py", "def test_t(cell):\n    pass\n")
    done = project.torchmatrix("run", "--torch", "system", "--run-id", "a", "--reports", "shard")
    assert done.returncode == 0, done.stderr
    return project.root


def _project_with_shard(tmp_path: Path, shard_run: Path) -> Project:
    project = Project(tmp_path / "project")
    shutil.copytree(shard_run, project.root, dirs_exist_ok=True)
    return project


@pytest.mark.parametrize("linked", ["checkpoints", "checkpoints/ws1/checkpoint", "reads"])
def test_merge_refuses_a_symlink_in_a_shard_and_copies_nothing_it_points_to(tmp_path, shard_run, linked):
    project = _project_with_shard(tmp_path, shard_run)
    secret = tmp_path / "ssh" / "id_rsa"
    secret.parent.mkdir()
    secret.write_text("PRIVATE KEY\n")
    secret.chmod(0o600)
    link = project.root / "shard" / "a" / "torch-system" / linked
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(secret if linked.endswith("checkpoint") else secret.parent)
    done = project.torchmatrix("merge", "shard/a", "--out", "merged", "--versions", "system")
    copied = [path for path in (project.root / "merged").rglob("*") if path.name == "id_rsa" or path.is_symlink()]
    assert copied == []
    assert done.returncode == 2, done.stderr
    assert f"{link} is a symlink to {link.readlink()}, not " in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (project.root / "merged").exists() or not any((project.root / "merged").iterdir())


def test_merge_keeps_each_checkpoint_files_mode(tmp_path, shard_run):
    project = _project_with_shard(tmp_path, shard_run)
    checkpoint = project.root / "shard" / "a" / "torch-system" / "checkpoints" / "ws1"
    checkpoint.mkdir(parents=True)
    (checkpoint / "private.bin").write_bytes(b"weights")
    (checkpoint / "private.bin").chmod(0o600)
    (checkpoint / "shared.bin").write_bytes(b"weights")
    (checkpoint / "shared.bin").chmod(0o644)
    done = project.torchmatrix("merge", "shard/a", "--out", "merged", "--versions", "system")
    assert done.returncode == 0, done.stderr
    merged = project.root / "merged" / "torch-system" / "checkpoints" / "ws1"
    assert oct((merged / "private.bin").stat().st_mode & 0o777) == oct(0o600)
    assert oct((merged / "shared.bin").stat().st_mode & 0o777) == oct(0o644)


def test_repro_without_config_runs_no_python_beside_the_matrix_the_run_recorded(tmp_path):
    """An artifact's plan.json records its own matrix.toml, with a `.nox/...-torch-V/bin/python` beside
    it that leaves a mark: repro uses this checkout's matrix.toml and runs nothing from the artifact."""
    artifact_run = write_fixture_run(tmp_path / "artifact")
    marker = tmp_path / "artifact-code-ran"
    planted = tmp_path / "artifact" / ".nox" / f"gpu_matrix-torch-{CANDIDATE.replace('.', '-')}" / "bin" / "python"
    planted.parent.mkdir(parents=True)
    planted.write_text(f"#!/bin/sh\ntouch {marker}\n")
    planted.chmod(0o755)
    here = tmp_path / "here"
    write_project(here)
    out = tmp_path / "repro"
    done = subprocess.run(
        [sys.executable, "-m", "torchmatrix", "repro", str(artifact_run), f"{CANDIDATE}/ws2-fsdp2/alpha::test_regress"]
        + ["--out", str(out)],
        cwd=here,
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert not marker.exists()
    assert done.returncode == 0, done.stderr
    assert (out / "repro.py").is_file()


@pytest.mark.parametrize("duration", ["Infinity", "9" * 400])
def test_an_absurd_duration_in_an_earlier_results_json_never_stops_a_run(tmp_path, duration):
    """The ETA reads the results.json of earlier runs under reports/: a duration no test took is passed over."""
    project = Project(tmp_path / "project")
    project.write("matrix.toml", SYSTEM_MATRIX)
    project.write("suites/test_s.py", "def test_t(cell):\n    pass\n")
    record = '{"torch": "system", "cell": "ws1", "suite": "s", "test": "test_t", "duration": ' + duration + "}"
    project.write("reports/earlier/results.json", '{"tests": [' + record + "]}")
    done = project.torchmatrix("run", "--torch", "system", "--run-id", "now")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "1 passed" in done.stdout, done.stdout


def _can_mount_tmpfs() -> bool:
    return (
        shutil.which("unshare") is not None
        and subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "tmpfs", "/mnt"], capture_output=True).returncode
        == 0
    )


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs `unshare -rm` to mount a small tmpfs")
@pytest.mark.parametrize("disk", ["full", "read-only"])
def test_merge_onto_a_full_or_read_only_disk_is_one_line_and_the_retry_works(tmp_path, shard_run, disk):
    """--out on a 96 KiB tmpfs that a 200 KB checkpoint overflows, or on a read-only one: exit 2 and
    one line, nothing left in --out; the same merge once the disk has room succeeds."""
    project = _project_with_shard(tmp_path, shard_run)
    big = project.root / "shard" / "a" / "torch-system" / "checkpoints" / "ws1" / "model.bin"
    big.parent.mkdir(parents=True)
    big.write_bytes(os.urandom(200_000))
    disk_dir = project.root / "disk"
    disk_dir.mkdir()
    options = "size=96k" if disk == "full" else "size=1m,ro"
    merge = f"{shlex.quote(sys.executable)} -m torchmatrix merge shard/a --out disk/merged --versions system"
    script = f"mount -t tmpfs -o {options} tmpfs disk && {merge} 2> first.err; echo $? > first.code; "
    script += f"ls -A disk > first.listing; mount -o remount,rw,size=4m disk && {merge} > /dev/null 2> second.err; echo $? > second.code"
    subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=project.root, env=checkout_env(), timeout=300)
    first = (project.root / "first.err").read_text()
    assert (project.root / "first.code").read_text().strip() == "2", first
    assert len(first.strip().splitlines()) == 1 and "Traceback" not in first, first
    reason = "No space left on device" if disk == "full" else "Read-only file system"
    assert first.startswith(f"torchmatrix: error: cannot write the merged run to {disk_dir / 'merged'} ({reason}"), (
        first
    )
    assert "nothing was left there" in first
    assert (project.root / "first.listing").read_text().split() == []
    assert (project.root / "second.code").read_text().strip() == "0", (project.root / "second.err").read_text()


def test_merge_refuses_shards_of_one_version_on_different_builds_naming_both(tmp_path, shard_run):
    """A `+cpu` shard and a `+cu126` shard on GPUs of one pin: one line naming both builds and devices."""
    project = _project_with_shard(tmp_path, shard_run)
    gpu_shard = project.root / "gpu-shard" / "torch-system"
    gpu_shard.mkdir(parents=True)
    plan = json.loads((project.root / "shard" / "a" / "torch-system" / "plan.json").read_text())
    plan["environment"] = {"torch": "2.13.0+cu126", "git_version": "abc123", "cuda_version": "12.6"}
    plan["environment"] |= {"gpu_count": 2, "gpu_name": "NVIDIA H100"}
    plan["cells"], plan["cell_axes"] = [], []
    (gpu_shard / "plan.json").write_text(json.dumps(plan))
    cpu_build = json.loads((project.root / "shard" / "a" / "torch-system" / "plan.json").read_text())["environment"]
    done = project.torchmatrix("merge", "shard/a", "gpu-shard", "--out", "merged", "--versions", "system")
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert "torch system was run on different builds or devices: " in done.stderr
    assert f"torch {cpu_build['torch']} (git {cpu_build['git_version']}), cpu (ranks simulated" in done.stderr
    assert "torch 2.13.0+cu126 (git abc123), cuda (2x NVIDIA H100, CUDA 12.6)" in done.stderr
    assert not (project.root / "merged").exists()


@pytest.mark.parametrize("recorded", [True, False], ids=["thresholds-recorded", "older-run"])
def test_report_never_reads_the_matrix_path_a_run_recorded(tmp_path, recorded):
    """The matrix path in plan.json may point anywhere (an artifact from another machine): the baseline and
    thresholds come from plan.json (or `--config`), and a run from before they were recorded gets defaults."""
    from helpers.report_runs import BASELINE

    run_dir = write_fixture_run(tmp_path / "project")
    for plan_file in run_dir.glob("torch-*/plan.json"):
        plan = json.loads(plan_file.read_text())
        if not recorded:
            del plan["baseline"], plan["thresholds"]
        plan_file.write_text(json.dumps(plan))
        recorded_matrix = Path(plan["matrix"])
    text = recorded_matrix.read_text().replace("drift_ratio = 10.0", "drift_ratio = 123.0")
    recorded_matrix.write_text(text.replace(f'baseline = "{BASELINE}"', f'baseline = "{CANDIDATE}"'))
    done = subprocess.run(
        [sys.executable, "-m", "torchmatrix", "report", str(run_dir)],
        cwd=tmp_path,
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stderr
    results = json.loads((run_dir / "results.json").read_text())["run"]
    assert results["thresholds"]["drift_ratio"] == 10.0
    assert results["baseline"] == BASELINE
    assert ("records no baseline or thresholds" in done.stderr) is not recorded, done.stderr
