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

from conftest import REPO, Project, checkout_env, matrix_toml


def slurm_matrix(version: str) -> str:
    """Two world sizes by two flavours of one demo suite, for the given torch."""
    return matrix_toml(
        torch=[version], axes={"world_size": [1, 2], "flavor": ["a", "b"]}, suites={"demo": {"timeout": 60}}
    )


DEMO = """
import torch
import torch.distributed as dist


def _sum_of_ranks():
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    return value.item()


def test_all_reduce(cell, ranks):
    n = cell.world_size
    assert ranks.run(_sum_of_ranks) == [n * (n + 1) / 2] * n


def test_launcher_world_matches_the_cell(cell, ranks):
    assert len(ranks.run(_sum_of_ranks)) == cell.world_size
"""

STAND_INS = {
    "sbatch": """
        import itertools, os, re, subprocess, sys
        script = sys.argv[-1]
        text = open(script).read()
        directives = dict(re.findall(r"^#SBATCH --([\\w-]+)=(.*)$", text, re.M))
        counter = os.path.join(os.environ["FAKE_SLURM_STATE"], "next-job-id")
        job = int(open(counter).read()) if os.path.exists(counter) else 100
        open(counter, "w").write(str(job + 1))
        dependency = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--dependency=")), "")
        with open(os.path.join(os.environ["FAKE_SLURM_STATE"], "submitted"), "a") as log:
            log.write(f"{job} {os.path.basename(script)} {dependency}\\n")
        first, last = map(int, directives["array"].split("-")) if "array" in directives else (None, None)
        for task in ([None] if first is None else range(first, last + 1)):
            env = dict(os.environ, SLURM_JOB_ID=f"{job}{task or ''}", SLURM_ARRAY_JOB_ID=str(job), SLURM_JOB_NAME=directives["job-name"],
                       SLURM_JOB_NODELIST="node[1-4]", SLURM_NNODES=directives["nodes"])
            if task is not None:
                env["SLURM_ARRAY_TASK_ID"] = str(task)
            with open(os.path.join(os.environ["FAKE_SLURM_STATE"], f"{job}-{task}.out"), "w") as output:
                subprocess.run(["bash", script], cwd=directives["chdir"], env=env, stdout=output, stderr=subprocess.STDOUT)
        print(job)
    """,
    "srun": """
        import os, subprocess, sys
        args = sys.argv[1:]
        nodes = 1
        while args and args[0].startswith("--"):
            if args[0].startswith("--nodes="):
                nodes = int(args[0].split("=", 1)[1])
            args = args[1:]
        procs = [subprocess.Popen(args, env=dict(os.environ, SLURM_NODEID=str(n), SLURM_PROCID=str(n))) for n in range(nodes)]
        sys.exit(max(p.wait() for p in procs))
    """,
    "scontrol": """
        print("127.0.0.1")
    """,
    "nox": """
        import os, subprocess, sys
        args = sys.argv[1:]
        if "--install-only" in args:
            sys.exit(0)
        posargs = args[args.index("--") + 1:] if "--" in args else []
        session = args[args.index("-s") + 1]
        command = [sys.executable, "-m", "torchmatrix"]
        if session.startswith("gpu_matrix(torch="):
            version = session.split("'")[1]
            command += ["run", "--torch", version, "--run-id", os.environ["TORCHMATRIX_RUN_ID"], "--reports", "reports"]
        else:
            command += [session]
        sys.exit(subprocess.run(command + posargs).returncode)
    """,
}


@pytest.fixture(scope="module")
def slurm_scripts(tmp_path_factory):
    """A project with `torchmatrix slurm`'s scripts written, stand-ins for Slurm's commands beside it."""
    root = tmp_path_factory.mktemp("slurm")
    project = Project(root / "project")
    project.write("matrix.toml", slurm_matrix(probe().base_version))
    project.write("suites/__init__.py", "")
    project.write("suites/test_demo.py", DEMO)
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
