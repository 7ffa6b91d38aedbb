"""The generated Slurm scripts on a real single-node Slurm: the array runs the shards, one task is
requeued mid-run (as a preemption does) and one is cancelled before it starts, and the merge job
(afterany) still writes a complete report.

nox is the one stand-in (test_slurm's): it maps `nox -s gpu_matrix(torch=V)` onto `torchmatrix run`
in this interpreter instead of building a venv per version, so the test takes a minute, not ten.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from junitparser import JUnitXml

from torchmatrix.env.devices import probe
from torchmatrix.matrix.config import load_matrix
from torchmatrix.matrix.selection import Shard, select_cells

from helpers.checkout import checkout_env
from helpers.projects import Project
from helpers.slurm_cluster import SlurmCluster, missing_reason
from helpers.slurm_stand_ins import DEMO, STAND_INS, slurm_matrix

# .ci/run sets it: there the cluster must start, and a machine that cannot start it fails the test.
REQUIRED = os.environ.get("TORCHMATRIX_REQUIRE_SLURM") == "1"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not REQUIRED and missing_reason() is not None, reason=missing_reason() or ""),
]


@pytest.fixture
def cluster(tmp_path):
    if missing_reason() is not None:
        pytest.fail(f"TORCHMATRIX_REQUIRE_SLURM=1, but {missing_reason()}")
    cluster = SlurmCluster(tmp_path / "slurm")
    (tmp_path / "slurm").mkdir()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_array_on_real_slurm_with_a_requeued_and_a_cancelled_task(cluster, tmp_path):
    project = Project(tmp_path / "project")
    project.write_suites(slurm_matrix(probe().base_version), test_demo=DEMO)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nox").write_text(f"#!{sys.executable}\n" + textwrap.dedent(STAND_INS["nox"]))
    (bin_dir / "nox").chmod(0o755)
    written = project.torchmatrix("slurm", "--shards", "2", "--gpus-per-node", "2", "--time", "00:10:00")
    assert written.returncode == 0, written.stderr
    scripts = project.root / "reports" / "slurm"
    assert not list(scripts.glob("wide-*.sbatch")), "every cell fits the node's two GPUs"

    env = {
        **checkout_env(),
        "SLURM_CONF": cluster.env["SLURM_CONF"],
        "PATH": os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), os.environ["PATH"]]),
        "TORCHMATRIX_SUBMISSION": "real-slurm",
    }
    submitted = subprocess.run(
        ["bash", str(scripts / "submit.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr

    # Each task asks for both GPUs, so the scheduler runs the array's tasks one after the other.
    def task(jobs, index):
        return next(
            (
                (job, state)
                for job, (name, state) in jobs.items()
                if name == "torchmatrix-cells" and job.endswith(f"_{index}")
            ),
            None,
        )

    cluster.wait_until(lambda jobs: (task(jobs, 0) or ("", ""))[1] == "RUNNING", 120, "array task 0 did not start")
    jobs = cluster.jobs()
    first, second = task(jobs, 0)[0], task(jobs, 1)
    assert second is not None and second[1] == "PENDING", jobs
    subprocess.run(["scancel", second[0]], env=cluster.env, check=True, timeout=60)
    cluster.scontrol("requeue", first)
    cluster.wait_until(lambda jobs: jobs.get(first, ("", ""))[1] == "PENDING", 60, "the requeued task is not pending")
    cluster.scontrol("update", f"JobId={first}", "StartTime=now")  # Slurm holds a requeued job back 120 s
    cluster.wait_until(lambda jobs: not jobs, 600, "the submission did not finish")

    assert "Restarts=1" in cluster.scontrol("show", "job", first), "task 0 ran again after the requeue"
    matrix = load_matrix(project.root / "matrix.toml")
    shards = {index: {cell.id for cell in select_cells(matrix.cells(), shard=Shard(index, 2))} for index in (1, 2)}
    merged = project.root / "reports" / "real-slurm-merged"
    suites = {suite.name.split("/")[1]: suite for suite in JUnitXml.fromfile(str(merged / "junit.xml"))}
    assert sorted(suites) == ["ws1-a", "ws1-b", "ws2-a", "ws2-b"], "every cell once"
    for cell in shards[1]:
        suite = suites[cell]
        assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (2, 0, 0, 0), cell
    for cell in shards[2]:
        cases = list(suites[cell])
        assert cases and all(case.is_error for case in cases), cell
        assert all("shard 2/2" in case.result[0].message for case in cases), cases[0].result[0].message
