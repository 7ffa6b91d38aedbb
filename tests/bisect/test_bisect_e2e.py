"""`torchmatrix bisect` end to end over fake torch releases that install in seconds.

A local wheel directory, added to pip's find-links, offers torch 2.90.0 ... 2.98.0: each fake
wheel is a dist-info plus a .pth that puts a real torch (the site-packages of this test's own) on
sys.path, so every "release" is the same torch under another version number. The component under
test reads that number and drops a rank's value from 2.95.0 on (or from the release a test says);
2.92.0 needs a package no index has, so it never installs; 2.91.0 installs a torch package that
cannot be imported (as a wheel built for a missing libcudart is). Venvs and wheels are shared by the
module's tests, as the bisect shares them across runs. A checkpointer that tags its checkpoints with a
format older releases refuse, from 2.95.0 on, makes the rollback direction break there.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from torchmatrix.matrix.config import ReportSettings
from torchmatrix.reports.records import RunResults, TestRecord, VersionInfo
from torchmatrix.reports.results_json import write_json
from torchmatrix.status import Confirmation

from helpers.fake_releases import fake_torch_wheel, offering, torch_site
from helpers.matrix_files import REFERENCE_COMPONENTS, write_matrix

pytestmark = pytest.mark.slow

RELEASES = [f"2.{minor}.0" for minor in range(90, 99)]
UNINSTALLABLE = "2.92.0"
UNIMPORTABLE = "2.91.0"
IMPORT_ERROR = "ImportError: libcudart.so.13: cannot open shared object file: No such file or directory"
MISSING_REQUIREMENT = "torchmatrix-test-no-such-package==1"
ROOT_CAUSE = "AssertionError: assert [2.0] == [1.0]"

SUITE = '''\
"""A reducer component's sum over the ranks equals the sum of the rank values."""

import torch
import torch.distributed as dist

from torchmatrix.testing import current_device, load


def _reduced(reducer):
    return load(reducer)(torch.tensor([float(dist.get_rank() + 1)], device=current_device())).item()


def test_sum_over_ranks(cell, ranks, components):
    world = cell.world_size
    assert ranks.run(_reduced, components["reducer"]) == [world * (world + 1) / 2] * world
'''

COMPONENT = '''\
"""A reducer that, from the torch release in RELEASE_SWITCH_FIRST_BAD on, counts its own rank's
value twice; in RELEASE_SWITCH_FLAKY it does so on every other call (a state file remembers). With
RELEASE_SWITCH_HANG set, it writes its pid there and hangs (an interrupted step)."""

import os
import time
from importlib import metadata
from pathlib import Path

import torch.distributed as dist


def _release(text):
    return tuple(int(part) for part in text.split("+")[0].split("."))


def _flaky_turn(release):
    if release != os.environ.get("RELEASE_SWITCH_FLAKY"):
        return False
    state = Path(os.environ["RELEASE_SWITCH_STATE"])
    if state.exists():
        state.unlink()
        return False
    state.write_text("failed once")
    return True


def reduce_sum(value):
    if os.environ.get("RELEASE_SWITCH_HANG"):
        Path(os.environ["RELEASE_SWITCH_HANG"]).write_text(str(os.getpid()))
        time.sleep(600)
    release = metadata.version("torch")
    dist.all_reduce(value)
    if _release(release) >= _release(os.environ["RELEASE_SWITCH_FIRST_BAD"]) or _flaky_turn(release):
        value += dist.get_rank() + 1
    return value
'''


NEW_FORMAT_COMPONENT = '''\
"""The reference checkpointer, tagging its checkpoints from torch 2.95.0 on with a format field that
releases before it refuse."""

from torchmatrix.models.mutants.cross_version import NewFormatCheckpointer


class Checkpointer(NewFormatCheckpointer):
    first_new_format = (2, 95)
'''
DIRECTION_CELL = {"world_size": "1", "fsdp": "none", "attn": "sdpa", "optimizer": "adamw"}


@pytest.fixture(scope="module")
def workdir():
    """A directory of the module's own: pytest's rotation of old base temps (other pytest sessions
    on the machine) must not remove venvs that later tests reuse."""
    path = Path(tempfile.mkdtemp(prefix="torchmatrix-bisect-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def project(workdir) -> dict:
    """The throwaway project, its fake releases and the environment every bisect of the module shares."""
    root = workdir / "project"
    wheels = root / "fake-releases"
    site = torch_site()
    for version in RELEASES:
        fake_torch_wheel(
            wheels,
            version,
            site,
            (MISSING_REQUIREMENT,) if version == UNINSTALLABLE else (),
            IMPORT_ERROR if version == UNIMPORTABLE else "",
        )
    (root / "suites").mkdir()
    (root / "suites" / "test_release_switch.py").write_text(SUITE)
    (root / "release_switch.py").write_text(COMPONENT)
    write_matrix(
        root,
        torch=["2.90.0", "2.98.0"],
        axes={"world_size": [1]},
        suites={"release_switch": {"timeout": 60}},
        components={"reducer": "release_switch:reduce_sum"},
    )
    env = {
        **offering(wheels, os.environ),
        "TORCHMATRIX_WHEELHOUSE": str(root / "wheelhouse"),
        "RELEASE_SWITCH_FIRST_BAD": "2.95.0",
        "RELEASE_SWITCH_STATE": str(root / "flaky-state"),
    }
    return {"root": root, "wheels": wheels, "env": env}


def bisect(project: dict, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    """`torchmatrix bisect` in the project; its output and the bisect.json it wrote."""
    result = subprocess.run(
        [sys.executable, "-m", "torchmatrix", "bisect", "--envdir", str(project["root"] / ".nox"), *args],
        cwd=project["root"],
        env={**project["env"], **env},
        capture_output=True,
        text=True,
        timeout=900,
    )
    written = [line.split(" writing to ", 1)[1] for line in result.stdout.splitlines() if " writing to " in line]
    if not written or not (Path(written[0]) / "bisect.json").is_file():
        pytest.fail(f"bisect wrote no report (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result, json.loads((Path(written[0]) / "bisect.json").read_text())


@pytest.fixture(scope="module")
def first_bad_search(project):
    return bisect(project, "--good", "2.93.0", "--bad", "2.98.0")


def test_first_bad_found_with_the_fewest_installs(first_bad_search):
    result, report = first_bad_search
    assert result.returncode == 0, result.stdout + result.stderr
    assert "release_switch::test_sum_over_ranks [ws1]: first bad: 2.95.0 (2.94.0 passed) — " in result.stdout
    assert "AssertionError" in result.stdout.splitlines()[-1]
    # Both pins decide which test regressed; between them, 4 candidates need 2 steps (ceil(log2(5)) = 3 at most).
    assert [step["version"] for step in report["steps"]] == ["2.98.0", "2.93.0", "2.95.0", "2.94.0"]
    assert report["regressions"][0]["candidates"] == ["2.94.0", "2.95.0", "2.96.0", "2.97.0"]
    assert "[3/" in result.stdout and "torch system ws1: failed" in result.stdout  # the matrix's progress line


def regression_run(root: Path, good: str, bad: str) -> Path:
    """A run directory whose upgrade diff has the suite's test passing on `good` and failing alone on
    `bad`: a search from it starts between the pins (running them is the first search's to prove)."""
    run = root / "reports" / f"regression-{good}-{bad}"
    run.mkdir(parents=True)
    test = ("ws1", "release_switch", "test_sum_over_ranks")
    records = [
        TestRecord(good, *test, "passed", 1.0),
        TestRecord(bad, *test, "failed", 1.0, ROOT_CAUSE, confirmation=Confirmation.FAILS_ALONE),
    ]
    versions = [VersionInfo(good), VersionInfo(bad)]
    results = RunResults(
        "regression", "", [], "", "", good, ReportSettings(), versions, {"ws1": {"world_size": "1"}}, records
    )
    write_json(run / "results.json", results, [])
    return run


def test_a_flaky_middle_release_stops_the_search(project, first_bad_search):
    run = regression_run(project["root"], "2.93.0", "2.98.0")
    result, report = bisect(
        project, "--from", str(run), RELEASE_SWITCH_FLAKY="2.95.0", RELEASE_SWITCH_FIRST_BAD="2.96.0"
    )
    assert result.returncode == 1, result.stdout + result.stderr
    line = result.stdout.splitlines()[-1]
    assert "no verdict: torch 2.95.0 flaky" in line and "passed alone" in line, line
    assert "first bad" not in result.stdout
    assert [step["version"] for step in report["steps"]] == ["2.95.0"]
    assert report["regressions"][0]["stopped_at"] == "2.95.0"
    assert "step 1: torch 2.95.0: reusing its venv" in result.stdout  # installed by the first search


def test_releases_that_do_not_install_or_import_are_skipped_with_their_reasons(project):
    result, report = bisect(project, "--from", str(regression_run(project["root"], "2.90.0", "2.93.0")))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"torch {UNINSTALLABLE} did not install: " in result.stdout
    assert "torchmatrix-test-no-such-package" in result.stdout
    assert f"torch {UNIMPORTABLE} installed but does not import: {IMPORT_ERROR}" in result.stdout
    line = result.stdout.splitlines()[-1]
    assert "first bad: one of 2.91.0, 2.92.0, 2.93.0 (2.90.0 passed; " in line, line
    assert f"2.91.0 installed but does not import torch: {IMPORT_ERROR}" in line, line
    steps = report["steps"]
    assert [step["version"] for step in steps] == ["2.91.0", "2.92.0"]
    assert steps[0]["imports"] is False and steps[0]["reason"] == IMPORT_ERROR
    assert steps[1]["installed"] is False and "torchmatrix-test-no-such-package" in steps[1]["reason"]


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def test_sigterm_ends_the_steps_processes_and_exits_130_with_what_was_decided(project, first_bad_search, tmp_path):
    hang = tmp_path / "rank.pid"
    process = subprocess.Popen(
        [sys.executable, "-m", "torchmatrix", "bisect", "--envdir", str(project["root"] / ".nox"),
         "--good", "2.93.0", "--bad", "2.98.0"],
        cwd=project["root"], env={**project["env"], "RELEASE_SWITCH_HANG": str(hang)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not hang.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert hang.exists(), process.communicate()
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stdout + stderr
    rank = int(hang.read_text())
    deadline = time.monotonic() + 15
    while not _gone(rank) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _gone(rank), "the step's rank outlived the bisect"
    out = Path(next(line.split(" writing to ", 1)[1] for line in stdout.splitlines() if " writing to " in line))
    report = json.loads((out / "bisect.json").read_text())
    assert report["interrupted"] is True and report["steps"][0]["interrupted"] is True
    assert "interrupted" in (out / "bisect.md").read_text()
    assert stdout.splitlines()[-1] == "interrupted before a search began: no release was judged"


@pytest.fixture(scope="module")
def plain_venv(project) -> Path:
    """A venv without torchmatrix, for the reproducer: a fake release brings torch and, from torch's
    own site-packages, pytest. It has no pip of its own (seeding one costs seconds); this one installs into it."""
    venv = project["root"] / "plain-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    if not (torch_site() / "pytest").is_dir():  # pytest installed apart from torch
        pip_install(venv, project, "pytest")
    return venv


def pip_install(venv: Path, project: dict, *arguments: str) -> None:
    """`pip install` into `venv` with this interpreter's pip, outside the test's PYTHONPATH."""
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", *arguments],
        check=True,
        capture_output=True,
        env={key: value for key, value in project["env"].items() if key != "PYTHONPATH"},
    )


def install_release(venv: Path, project: dict, version: str) -> None:
    pip_install(
        venv, project, "--force-reinstall", "--no-deps", "--no-index", "--find-links", str(project["wheels"]),
        f"torch=={version}",
    )  # fmt: skip


def test_the_reproducer_fails_without_torchmatrix_as_the_run_did_and_passes_on_the_good_release(
    project, first_bad_search, plain_venv
):
    _, report = first_bad_search
    out_dir = Path(report["out"])
    bad_run = out_dir / "steps" / report["steps"][0]["run"]
    failure = "system/ws1/release_switch::test_sum_over_ranks"
    venv_python = project["root"] / ".nox"
    written = subprocess.run(
        [sys.executable, "-m", "torchmatrix", "repro", str(bad_run), failure, "--out", str(project["root"] / "repro"),
         "--python", str(next(venv_python.glob("*2-98-0*")) / "bin" / "python")],
        cwd=project["root"], env=project["env"], capture_output=True, text=True,
    )  # fmt: skip
    assert written.returncode == 0, written.stdout + written.stderr
    repro = project["root"] / "repro"
    assert sorted(p.name for p in repro.iterdir()) == [
        "README.md",
        "cell.json",
        "collect_env.txt",
        "command.txt",
        "repro.py",
    ]
    assert (repro / "command.txt").read_text() == "python repro.py\n"
    assert "PyTorch version" in (repro / "collect_env.txt").read_text()
    readme = (repro / "README.md").read_text()
    root_cause = ROOT_CAUSE
    assert "## What was expected" in readme and f"`{root_cause}`" in readme

    plain = {key: value for key, value in project["env"].items() if key != "PYTHONPATH"}
    python = str(plain_venv / "bin" / "python")
    assert (
        subprocess.run([python, "-c", "import torchmatrix"], cwd=repro, env=plain, capture_output=True).returncode == 1
    )
    install_release(plain_venv, project, "2.98.0")
    failed = subprocess.run([python, "repro.py"], cwd=repro, env=plain, capture_output=True, text=True, timeout=300)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert failed.stdout.splitlines()[-1] == f"root cause: {root_cause}", failed.stdout
    install_release(plain_venv, project, "2.94.0")
    passed = subprocess.run([python, "repro.py"], cwd=repro, env=plain, capture_output=True, text=True, timeout=300)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert passed.stdout.splitlines()[-1].endswith("in cell ws1: passed")


def rollback_run(root: Path, baseline: str, candidate: str, cell_id: str) -> Path:
    """A run directory whose baseline failed, confirmed alone, to read the candidate's checkpoint of one cell."""
    run = root / "reports" / f"rollback-{candidate}"
    run.mkdir(parents=True)
    read = TestRecord(baseline, cell_id, "cross_version", f"test_loads_checkpoint_written_by[writer={candidate}]",
                      "failed", 1.0, "RuntimeError: checkpoint format 2 is not readable",
                      confirmation=Confirmation.FAILS_ALONE)  # fmt: skip
    results = RunResults("rollback", "", [], "", "", baseline, ReportSettings(), [], {cell_id: DIRECTION_CELL}, [read])
    write_json(run / "results.json", results, [])
    return run


def test_a_rollback_break_is_bisected_to_the_first_release_whose_checkpoint_the_baseline_cannot_read(project):
    """Each step writes the cell's checkpoint with its release and reads it with the baseline, whose
    venv is made ready once (the module's earlier searches installed every venv it uses)."""
    root = project["root"]
    config = root / "directions" / "matrix.toml"
    write_matrix(
        config.parent,
        torch=["2.93.0", "2.96.0"],
        axes={"world_size": [1], "fsdp": ["none"], "attn": ["sdpa"], "optimizer": ["adamw"]},
        suites={"cross_version": {"path": None, "timeout": 300}},
        components={**REFERENCE_COMPONENTS, "checkpointer": "release_format:Checkpointer"},
    )
    (config.parent / "release_format.py").write_text(NEW_FORMAT_COMPONENT)
    run = rollback_run(root, "2.93.0", "2.96.0", "ws1-none-sdpa-adamw")
    result, report = bisect(project, "--config", str(config), "--from", str(run))
    assert result.returncode == 0, result.stdout + result.stderr
    line = result.stdout.splitlines()[-1]
    assert line.startswith(
        "rollback [ws1-none-sdpa-adamw] (torch 2.93.0 reading each release's checkpoint): first bad: 2.95.0 (2.94.0 passed) — "
    ), line
    assert "checkpoint format 2 (written by torch 2.95.0) is not readable by torch 2.93.0" in line, line
    steps = report["steps"]
    assert [(step["version"], step["checkpoints"]) for step in steps] == [
        ("2.94.0", [["2.94.0", "2.93.0"]]),
        ("2.95.0", [["2.95.0", "2.93.0"]]),
    ]
    assert result.stdout.count("torch 2.93.0: its gpu_matrix venv") == 1, result.stdout
    assert report["regressions"][0]["direction"] == "rollback"
