"""The generated Slurm scripts, run end to end with stand-in sbatch/srun/scontrol/nox on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from junitparser import JUnitXml

from torchmatrix.env.devices import probe
from torchmatrix.messages.group_plan import GroupPlan

from helpers.checkout import REPO, checkout_env
from helpers.projects import Project
from helpers.slurm_stand_ins import DEMO, STAND_INS, slurm_matrix


@pytest.fixture(scope="module")
def slurm_scripts(tmp_path_factory):
    """A project with `torchmatrix slurm`'s scripts written, stand-ins for Slurm's commands beside it."""
    root = tmp_path_factory.mktemp("slurm")
    project = Project(root / "project")
    project.write_suites(slurm_matrix(probe().base_version), test_demo=DEMO)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name, body in STAND_INS.items():
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
        path.chmod(0o755)
    state = root / "state"
    state.mkdir()
    written = project.torchmatrix("slurm", "--shards", "2", "--gpus-per-node", "1", "--rdzv-port", str(_free_port()))
    assert written.returncode == 0, written.stderr
    return project, root


@pytest.fixture(scope="module")
def slurm_project(slurm_scripts):
    """The scripts submitted to the stand-ins: every job ran, its cells and the merge included."""
    project, root = slurm_scripts
    bin_dir, state = root / "bin", root / "state"
    env = {
        **checkout_env(),
        "PATH": os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), os.environ["PATH"]]),
        "FAKE_SLURM_STATE": str(state),
        "TORCHMATRIX_SUBMISSION": "slurm-test",
    }
    submitted = subprocess.run(
        ["bash", str(project.root / "reports" / "slurm" / "submit.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return project, state, submitted


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_multinode_launch_line(slurm_scripts):
    project, _ = slurm_scripts
    wide = (project.root / "reports" / "slurm" / "wide-ws2.sbatch").read_text()
    assert "#SBATCH --nodes=2" in wide and "#SBATCH --gpus-per-node=1" in wide
    launch = next(line for line in wide.splitlines() if line.startswith("nox "))
    assert "--only world_size=2 --gpus-per-node 1 --multinode-launcher" in launch
    assert (
        '"srun --nodes={nnodes} --ntasks-per-node=1 torchrun --nnodes={nnodes} --nproc-per-node={nproc_per_node}'
        " --rdzv-backend=c10d --rdzv-endpoint=$head:" in launch
    )
    assert "--rdzv-id=$SLURM_JOB_ID" in launch
    cells = (project.root / "reports" / "slurm" / "cells.sbatch").read_text()
    assert "#SBATCH --array=0-1" in cells and "--only world_size=1" in cells


@pytest.mark.slow
def test_submit_runs_setup_cells_wide_and_merge_afterany(slurm_project):
    _, state, submitted = slurm_project
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    jobs = [line.split() for line in (state / "submitted").read_text().splitlines()]
    names = [job[1] for job in jobs]
    assert names == ["setup.sbatch", "cells.sbatch", "wide-ws2.sbatch", "merge.sbatch"]
    setup, cells, wide = jobs[0][0], jobs[1][0], jobs[2][0]
    assert jobs[1][2] == jobs[2][2] == f"afterok:{setup}"
    assert jobs[3][2] == f"afterany:{cells}:{wide}"


@pytest.mark.slow
def test_the_merged_report_holds_every_cell_passed(slurm_project):
    project, _, _ = slurm_project
    merged = project.root / "reports" / "slurm-test-merged"
    suites = list(JUnitXml.fromfile(str(merged / "junit.xml")))
    assert sorted(s.name.split("/")[1] for s in suites) == ["ws1-a", "ws1-b", "ws2-a", "ws2-b"]
    for suite in suites:
        assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (2, 0, 0, 0), suite.name


@pytest.mark.slow
def test_wide_cells_ran_as_one_pytest_per_rank_under_torchrun(slurm_project):
    project, _, _ = slurm_project
    [version_dir] = (project.root / "reports" / "slurm-test" / "torch-ws2-0").parent.glob("torchmatrix-ws2-0/torch-*")
    logs = version_dir / "logs"
    assert (logs / "ws2.events.jsonl").exists()
    assert (logs / "ws2.events.jsonl.rank1").exists(), "rank 1 was its own pytest process, started by torchrun"
    assert GroupPlan.read(logs / "ws2.plan.json").launched


@pytest.mark.slow
@pytest.mark.parametrize(("required", "outcome"), [("1", "1 error"), ("", "1 skipped")])
def test_the_real_slurm_test_fails_instead_of_skipping_where_ci_requires_it(required, outcome):
    """Where Slurm is missing: skipped with its reason, unless TORCHMATRIX_REQUIRE_SLURM=1 (.ci/run)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-rsE", "tests/scale/test_slurm_cluster.py"],
        cwd=REPO,
        env={**checkout_env(), "PATH": os.path.dirname(sys.executable), "TORCHMATRIX_REQUIRE_SLURM": required},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert outcome in done.stdout and (done.returncode != 0) == bool(required), done.stdout[-3000:]
    assert "Slurm is not installed (munged, slurmctld, slurmd" in done.stdout
    if required:
        assert "TORCHMATRIX_REQUIRE_SLURM=1, but Slurm is not installed" in done.stdout
