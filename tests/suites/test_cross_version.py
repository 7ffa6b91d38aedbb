"""Checkpoints across torch versions, for real: torch 2.13.0 (this interpreter) and 2.14.1 (a venv made
once, beside this one's, ~1 min and 5.5 GB the first time) each run the cross_version suite on the
smallest cell, then `cross-read` has each load the other's writes.

With the reference checkpointer both directions load exactly, in the eager cell and a compiled one
(parameter names with `_orig_mod.`), both cells in one pair of runs; where 2.14.1's writes are missing,
2.13.0's read pass reports them not checked, never passed; with a checkpointer that refuses a
checkpoint another torch wrote, the rollback section names its root cause (the failed read confirmed
alone, with its `reproduce:` command) and `compare` and `report --check-upgrade` exit 1.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from junitparser import JUnitXml

from torchmatrix.status import Confirmation

from helpers.checkout import PROJECT_IS_THIS_CHECKOUT, REPO, checkout_env, unconstrained_pip
from helpers.matrix_files import REFERENCE_COMPONENTS, matrix_toml

pytestmark = pytest.mark.slow

BASELINE, CANDIDATE = "2.13.0", "2.14.1"
MUTANT = "torchmatrix.models.mutants.cross_version:VersionTaggedCheckpointer"
CELL = {"world_size": [1], "fsdp": ["none"], "attn": ["sdpa"], "optimizer": ["adamw"]}
# The reference's cells: the smallest, eager and with its blocks compiled.
REFERENCE_CELLS = {**CELL, "compile": ["none", "aot_eager"]}
EAGER, COMPILED = "ws1-none-sdpa-adamw-none", "ws1-none-sdpa-adamw-aot_eager"


@pytest.fixture(scope="module")
def candidate_python() -> str:
    """A Python with torch 2.14.1 and this checkout, made once per machine (TORCHMATRIX_TEST_TORCH_2_14_1
    names another venv) and shared under a lock by parallel workers."""
    venv = Path(os.environ.get("TORCHMATRIX_TEST_TORCH_2_14_1") or Path(sys.prefix).parent / f".venv-torch-{CANDIDATE}")
    python = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".venv-torch-{CANDIDATE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        probe = [str(python), "-c", "import torch, torchmatrix; print(torch.__version__)"]
        if (
            not python.exists()
            or subprocess.run(probe, capture_output=True, text=True).stdout.split("+")[0] != CANDIDATE
        ):
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            pip = [str(python), "-m", "pip", "install", "-q", f"torch=={CANDIDATE}", "numpy", "-e", str(REPO)]
            subprocess.run(pip, env=unconstrained_pip(os.environ), check=True, timeout=1200)
    return str(python)


def torchmatrix(python: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-m", "torchmatrix", *args], cwd=REPO, env=checkout_env(), capture_output=True, text=True, timeout=900
    )


def run_both(root: Path, checkpointer: str, candidate_python: str, *, cell: dict = CELL) -> Path:
    """Run both versions' cross_version suite on ``cell`` into one run directory, then the read pass;
    return the run directory."""
    root.mkdir(parents=True)
    matrix = root / "matrix.toml"
    components = {**REFERENCE_COMPONENTS, "checkpointer": checkpointer}
    matrix.write_text(
        matrix_toml(
            torch=[BASELINE, CANDIDATE], axes=cell, suites={"cross_version": {"path": None}}, components=components
        )
        + PROJECT_IS_THIS_CHECKOUT
    )
    common = ["--config", str(matrix), "--reports", str(root / "reports"), "--run-id", "run", "--confirm-limit", "0"]
    common += ["--slots", "1"]  # the cells share one pytest process: one import of torch, not one per cell
    run_dir = root / "reports" / "run"
    assert torchmatrix(sys.executable, "run", "--torch", BASELINE, *common).returncode == 0
    assert torchmatrix(candidate_python, "run", "--torch", CANDIDATE, *common).returncode == 0
    cross_read(run_dir, candidate_python)
    return run_dir


def cross_read(run_dir: Path, candidate_python: str) -> subprocess.CompletedProcess:
    """The read pass with the project's matrix (beside reports/) and each version's interpreter
    named (neither is a gpu_matrix venv here; the run's plan.json names them too, and is ignored)."""
    config = run_dir.parent.parent / "matrix.toml"
    interpreters = ["--python", f"{BASELINE}={sys.executable}", "--python", f"{CANDIDATE}={candidate_python}"]
    return torchmatrix(sys.executable, "cross-read", str(run_dir), "--config", str(config), *interpreters)


def directions(results: Path) -> dict[str, dict]:
    (upgrade,) = json.loads(results.read_text())["upgrade"]
    return {d["direction"]: d for d in upgrade["checkpoints"]}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, candidate_python) -> Path:
    root = tmp_path_factory.mktemp("reference")
    checkpointer = REFERENCE_COMPONENTS["checkpointer"]
    return run_both(root / "p", checkpointer, candidate_python, cell=REFERENCE_CELLS)


@pytest.fixture(scope="module")
def mutant(tmp_path_factory, candidate_python) -> Path:
    """The reference's eager cell (`compare` pairs it with the reference's) with the mutant checkpointer."""
    return run_both(
        tmp_path_factory.mktemp("mutant") / "p", MUTANT, candidate_python, cell={**CELL, "compile": ["none"]}
    )


@pytest.fixture(scope="module")
def reference_upgrade_check(reference) -> subprocess.CompletedProcess:
    """`report --check-upgrade` of the reference's run, once for the tests that read its exit and pages."""
    return torchmatrix(sys.executable, "report", str(reference), "--check-upgrade")


def test_reference_checkpoints_load_exactly_both_ways(reference, reference_upgrade_check):
    done = reference_upgrade_check
    assert done.returncode == 0, done.stdout + done.stderr
    found = directions(reference / "results.json")
    for name in ("rollback", "forward"):
        assert sorted(found[name]["passed"]) == sorted([EAGER, COMPILED]) and not found[name]["broken"], found[name]
        assert not found[name]["not_checked"], found[name]
    assert (
        "✅ **rollback**: checkpoints written by 2.14.1 load exactly under 2.13.0"
        in (reference / "summary.md").read_text()
    )


def test_a_compiled_models_checkpoint_loads_exactly_both_ways(reference, reference_upgrade_check):
    """Its blocks are torch.compile modules (parameter names with `_orig_mod.`); the checkpoint written
    by either version loads exactly under the other (the directions' passed cells name it, beside the
    eager one: test_reference_checkpoints_load_exactly_both_ways), each write compiled."""
    done = reference_upgrade_check
    assert done.returncode == 0, done.stdout + done.stderr
    tests = json.loads((reference / "results.json").read_text())["tests"]
    reads = [t for t in tests if t["cell"] == COMPILED and t["test"].startswith("test_loads_checkpoint_written_by")]
    assert len(reads) == 2 and all(t["status"] == "passed" for t in reads), reads
    writes = [t for t in tests if t["cell"] == COMPILED and t["test"].startswith("test_writes")]
    assert len(writes) == 2 and all(t["figures"].get("compile_seconds", 0) > 0 for t in writes), writes


def test_missing_writes_are_not_checked_never_passed(reference, tmp_path):
    """A copy of the reference's run without 2.14.1's checkpoints, re-read by 2.13.0 alone (2.14.1 has no
    interpreter here, so its forward reads stay as the reference's pass left them)."""
    copy = tmp_path / "run"
    shutil.copytree(reference, copy, symlinks=True)
    shutil.rmtree(copy / f"torch-{CANDIDATE}" / "checkpoints")
    config = reference.parent.parent / "matrix.toml"
    only_baseline = ["--python", f"{BASELINE}={sys.executable}", "--envdir", str(tmp_path / "no-venvs")]
    assert torchmatrix(sys.executable, "cross-read", str(copy), "--config", str(config), *only_baseline).returncode == 0
    assert torchmatrix(sys.executable, "report", str(copy), "--check-upgrade").returncode == 0
    tests = json.loads((copy / "results.json").read_text())["tests"]
    early = [t for t in tests if t["test"] == f"test_loads_checkpoint_written_by[writer={CANDIDATE}]"]
    assert sorted(t["cell"] for t in early) == sorted([EAGER, COMPILED]), early
    for read in early:
        assert read["status"] == "skipped", read
        assert read["message"].startswith("not checked: torch 2.14.1 wrote no checkpoint"), read
    found = directions(copy / "results.json")
    assert not found["rollback"]["passed"] and not found["rollback"]["broken"], found["rollback"]
    (reason,) = found["rollback"]["not_checked"]  # the cells with the same reason, together
    assert reason["reason"].startswith("not checked: torch 2.14.1 wrote no checkpoint for this cell"), reason
    assert sorted(reason["cells"]) == sorted([EAGER, COMPILED]), reason
    assert sorted(found["forward"]["passed"]) == sorted([EAGER, COMPILED])
    assert (
        "⚠️ **rollback**: not checked: no checkpoint written by 2.14.1 was read by 2.13.0"
        in (copy / "summary.md").read_text()
    )


def test_unreadable_rollback_is_reported_with_its_root_cause_and_fails_compare(mutant, reference):
    done = torchmatrix(sys.executable, "report", str(mutant), "--check-upgrade")
    assert done.returncode == 1, done.stdout + done.stderr
    found = directions(mutant / "results.json")
    assert found["rollback"]["broken"] and found["forward"]["broken"]
    (failure,) = found["rollback"]["failed"]
    assert failure["root_cause"].startswith("RuntimeError: checkpoint format of torch 2.14.1"), failure
    assert failure["root_cause"].endswith("is not readable by torch 2.13.0+cpu"), failure
    summary = (mutant / "summary.md").read_text()
    assert (
        "❌ **rollback**: checkpoints written by 2.14.1 cannot be read by 2.13.0, caused by 2.14.1's writer"
        " — `RuntimeError: checkpoint format" in summary
    )
    read = next(
        t
        for t in json.loads((mutant / "results.json").read_text())["tests"]
        if t["torch"] == BASELINE
        and t["status"] == "failed"
        and t["test"].startswith("test_loads_checkpoint_written_by")
    )
    assert read["confirmation"] == Confirmation.FAILS_ALONE.value, read  # re-read alone by cross-read
    failure = f"{BASELINE}/{read['cell']}/cross_version::{read['test']}"
    assert f"reproduce: `{shlex.join(['torchmatrix', 'repro', 'reports/run', failure])}`" in summary
    suites = {suite.name: suite for suite in JUnitXml.fromfile(str(mutant / "junit.xml"))}
    assert suites[f"rollback/2.14.1→2.13.0/{EAGER}"].failures == 1, list(suites)
    assert suites[f"torch-2.13.0/{EAGER}"].failures == 0, "the baseline's own tests passed"
    compared = torchmatrix(sys.executable, "compare", str(reference), str(mutant))
    assert compared.returncode == 1, compared.stdout + compared.stderr
    assert "cannot be read by 2.13.0" in compared.stdout
