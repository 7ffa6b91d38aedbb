"""Scale-out: shards run as separate processes and merged equal one run; GitHub fan-out; merge errors."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from junitparser import JUnitXml

from torchmatrix.cli import build_parser

from helpers.checkout import REPO
from helpers.matrix_files import matrix_toml
from helpers.projects import Project


def scale_out_matrix(torch=("system",), flavors=("a", "b", "c")) -> str:
    """A demo suite per world size and a per-cell suite over every flavour."""
    return matrix_toml(
        torch=torch,
        axes={"world_size": [1, 2], "flavor": list(flavors)},
        suites={"demo": {"timeout": 30, "axes": ["world_size"]}, "per_cell": {"timeout": 30}},
    )


DEMO = """
import torch.distributed as dist


def _rank():
    return dist.get_rank()


def test_ranks(cell, ranks):
    assert ranks.run(_rank) == list(range(cell.world_size))
"""

PER_CELL = """
def test_flavor_c_fails(cell):
    assert cell["flavor"] != "c", f"flavor c is broken in {cell.id}"
"""


def statuses(run_dir) -> dict[tuple[str, str], str]:
    """(suite name, testcase name) -> status, the content that must match across merge and single run."""
    found = {}
    for suite in JUnitXml.fromfile(str(run_dir / "junit.xml")):
        for case in suite:
            status = "passed" if case.is_passed else type(case.result[0]).__name__.lower()
            found[(suite.name, case.name)] = status
    return found


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """The same matrix run once whole and once as 4 shards, each its own process and run directory
    (no failure re-run alone: merge is compared, not confirmation)."""
    project = Project(tmp_path_factory.mktemp("scale") / "project")
    project.write_suites(scale_out_matrix(), test_demo=DEMO, test_per_cell=PER_CELL)
    single = project.torchmatrix("run", "--torch", "system", "--run-id", "single", "--confirm-limit", "0")
    assert single.returncode == 1, single.stderr
    for index in range(1, 5):
        done = project.torchmatrix(
            "run",
            "--torch",
            "system",
            "--shard",
            f"{index}/4",
            "--reports",
            f"artifacts/job{index}",
            "--run-id",
            "shard",
            "--confirm-limit",
            "0",
        )
        assert done.returncode in (0, 1), done.stderr
    return project


@pytest.mark.slow
def test_four_shards_merged_equal_one_run_cell_for_cell(sharded):
    done = sharded.torchmatrix("merge", "artifacts", "--out", "merged")
    assert done.returncode == 1, done.stdout + done.stderr
    merged, single = statuses(sharded.root / "merged"), statuses(sharded.root / "reports" / "single")
    assert merged == single
    assert len(merged) == 6 * 2
    plan = json.loads((sharded.root / "merged" / "torch-system" / "plan.json").read_text())
    assert plan["missing"] == [] and len(plan["cells"]) == 6


@pytest.mark.slow
def test_a_missing_shard_becomes_errored_cells_that_say_so(sharded, tmp_path):
    inputs = tmp_path / "inputs"
    for index in (1, 2, 4):
        shutil.copytree(sharded.root / "artifacts" / f"job{index}", inputs / f"job{index}", symlinks=True)
    done = sharded.torchmatrix("merge", str(inputs), "--out", str(tmp_path / "merged"))
    assert done.returncode == 1
    assert "planned cells had no report" in done.stderr
    merged = statuses(tmp_path / "merged")
    assert set(statuses(sharded.root / "reports" / "single")) == set(merged), "every planned testcase, none missing"
    errored = [key for key, status in merged.items() if status == "error"]
    assert errored, "shard 3's cells are errors, not gaps"
    suite = next(s for s in JUnitXml.fromfile(str(tmp_path / "merged" / "junit.xml")) for c in s if c.is_error)
    assert "shard 3/4 of torch system delivered none" in next(iter(suite)).result[0].message


@pytest.mark.slow
def test_duplicate_reports_are_refused(sharded, tmp_path):
    done = sharded.torchmatrix("merge", "artifacts/job1", "artifacts/job1", "--out", str(tmp_path / "merged"))
    assert done.returncode == 2
    assert "reported twice" in done.stderr and done.stderr.count("\n") == 1


@pytest.mark.slow
def test_a_report_from_another_matrix_is_refused(sharded, tmp_path):
    other = sharded.root / "other.toml"
    other.write_text(scale_out_matrix(flavors=("a", "b", "c", "d")))
    done = sharded.torchmatrix("merge", "artifacts", "--out", str(tmp_path / "merged"), "--config", str(other))
    assert done.returncode == 2 and "another matrix.toml" in done.stderr


def github(project, *args):
    done = project.torchmatrix("github-matrix", *args)
    return done.returncode, (json.loads(done.stdout) if done.returncode == 0 else done.stderr)


def test_github_matrix_has_one_job_per_version_and_shard(project):
    project.write("matrix.toml", scale_out_matrix(torch=("2.13.0", "2.14.1")))
    project.write("suites/test_demo.py", DEMO)
    project.write("suites/test_per_cell.py", PER_CELL)
    code, jobs = github(project, "--shards", "3", "--only", "flavor=a,b")
    assert code == 0
    include = jobs["include"]
    assert [(j["torch"], j["shard"]) for j in include] == [
        (v, f"{i}/3") for v in ("2.13.0", "2.14.1") for i in (1, 2, 3)
    ]
    assert include[0]["session"] == "gpu_matrix(torch='2.13.0')"
    assert include[0]["args"] == "--only=flavor=a,b --shard 1/3"
    assert [j["gpus"] for j in include[:3]] == [1, 2, 2]
    assert sum(j["cells"] for j in include[:3]) == 4


def test_github_matrix_refuses_more_than_256_jobs(project):
    project.write("matrix.toml", scale_out_matrix(torch=("2.13.0", "2.14.1")))
    project.write("suites/test_demo.py", DEMO)
    project.write("suites/test_per_cell.py", PER_CELL)
    code, error = github(project, "--shards", "200")
    assert code == 2 and "over GitHub's limit of 256" in error and "--shards 128" in error


def test_workflow_parses_and_uses_only_commands_that_exist():
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "gpu-matrix.yml").read_text())
    steps = [step for job in workflow["jobs"].values() for step in job["steps"]]
    runs = [step["run"] for step in steps if "run" in step]
    subcommands = set(build_parser()._subparsers._group_actions[0].choices)
    used = {
        line.split("python -m torchmatrix ", 1)[1].split()[0]
        for run in runs
        for line in run.splitlines()
        if "python -m torchmatrix " in line
    }
    assert used and used <= subcommands, used - subcommands
    assert any('nox -s "${{ matrix.session }}" -- ${{ matrix.args }}' in run for run in runs)
    fan_out = workflow["jobs"]["cells"]
    assert fan_out["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert "matrix.gpus" in str(fan_out["runs-on"])
    assert workflow["jobs"]["merge"]["if"] == "always()", "the merge must run even when cells fail"


@pytest.mark.slow
def test_merge_carries_cross_version_checkpoints_and_reads(sharded, tmp_path):
    """A merge of per-version or per-shard jobs keeps what cross_version wrote and read, so the merged
    report has both directions and a `cross-read` of the merge finds every version's writes."""
    inputs = tmp_path / "inputs"
    shutil.copytree(sharded.root / "artifacts", inputs, symlinks=True)
    version_dir = next((inputs / "job1").glob("*/torch-system"))
    cell = next(version_dir.glob("*.xml")).stem
    written = version_dir / "checkpoints" / cell
    (written / "checkpoint").mkdir(parents=True)
    (written / "expected.json").write_text("{}")
    (version_dir / "reads").mkdir()
    shutil.copyfile(version_dir / f"{cell}.xml", version_dir / "reads" / f"{cell}.xml")
    sharded.torchmatrix("merge", str(inputs), "--out", str(tmp_path / "merged"))
    merged = tmp_path / "merged" / "torch-system"
    assert (merged / "checkpoints" / cell / "expected.json").read_text() == "{}"
    assert (merged / "checkpoints" / cell / "checkpoint").is_dir()
    assert (merged / "reads" / f"{cell}.xml").is_file()
