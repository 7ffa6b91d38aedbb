"""The peak_memory suite and the upgrade diff's memory rule, through real runs of the CLI on CPU: two runs
of the reference stack (one rank; two ranks under FSDP2) record the same step bytes and compare clean, and a
run whose blocks are checkpointed under a selective-checkpoint policy that saves every op (the memory mutant
of models/mutants/compiled_recompute.py: checkpointing applied, nothing recomputed) is flagged, naming the
activations, in the cells where it holds more."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.checkout import REPO, checkout_env
from helpers.matrix_files import REFERENCE_COMPONENTS, matrix_toml
from helpers.run_results import run_suites

pytestmark = pytest.mark.slow

MUTANTS = "torchmatrix.models.mutants.compiled_recompute"
CELLS = ("ws1-none-sdpa-adamw-none", "ws1-none-sdpa-adamw-aot_eager", "ws2-fsdp2-sdpa-adamw-none")
COMPILED = "ws1-none-sdpa-adamw-aot_eager"
MEMORY_SECTION = "#### Memory grown past 1.25×"
KINDS = ("parameters", "optimizer_state", "gradients", "activations", "temporaries")
ATTRIBUTED = ("parameters", "optimizer_state", "gradients", "activations")
# run -> (its components over the reference ones, its cells): the reference twice, then two memory mutants.
# A policy that saves every op runs only compiled: in eager, checkpoint's dispatch mode cannot build the
# decoder's causal-bias tensor subclass (as torch's MemTracker cannot).
RUNS = {
    "first": ({}, CELLS),
    "second": ({}, CELLS),
    "checkpointing_dropped": ({"parallelize": f"{MUTANTS}:checkpoint_dropping_parallelize"}, CELLS),
    "saving_every_op": ({"model": f"{MUTANTS}:every_op_saving_model"}, (COMPILED,)),
}


def memory_matrix(components: dict, cells: tuple[str, ...]) -> str:
    compiles = sorted({cell.rsplit("-", 1)[1] for cell in cells}, key=len, reverse=True)
    return matrix_toml(
        axes={
            "world_size": [1, 2],
            "fsdp": ["none", "fsdp2"],
            "attn": ["sdpa"],
            "optimizer": ["adamw"],
            "compile": compiles,
        },
        exclude=[
            {"world_size": 1, "fsdp": "fsdp2"},
            {"world_size": 2, "fsdp": "none"},
            {"world_size": 2, "compile": "aot_eager"},
        ],
        suites={"peak_memory": {"path": None}},
        components={**REFERENCE_COMPONENTS, "batch": "torchmatrix.models.transformer:make_batch", **components},
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Each run's directory (its results.json written by `report`), by name."""
    found = {}
    for name, (components, cells) in RUNS.items():
        root = tmp_path_factory.mktemp(name)
        done, outcomes = run_suites(root, memory_matrix(components, cells))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        assert outcomes == {cell: {"test_training_step_memory": "passed"} for cell in cells}, outcomes
        latest = (root / "reports" / "latest").resolve()
        subprocess.run(
            [sys.executable, "-m", "torchmatrix", "report", str(latest)],
            cwd=REPO,
            env=checkout_env(),
            check=True,
            capture_output=True,
        )
        found[name] = latest
    return found


def step_figures(run) -> dict[str, dict[str, float]]:
    tests = json.loads((run / "results.json").read_text())["tests"]
    return {t["cell"]: t["figures"] for t in tests if t["suite"] == "peak_memory"}


def compare(a, b) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchmatrix", "compare", str(a), str(b)],
        cwd=REPO,
        env=checkout_env(),
        capture_output=True,
        text=True,
    )


def test_each_cell_records_its_step_by_kind_and_its_resident_peak(runs):
    for cell, figures in step_figures(runs["first"]).items():
        assert figures["step_peak_bytes"] > 0
        assert all(f"step_peak_bytes/{kind}" in figures for kind in KINDS), figures
        assert figures["step_peak_bytes/parameters"] > 0 and figures["step_peak_bytes/activations"] > 0, cell
        assert figures["peak_rss_bytes"] > figures["step_peak_bytes"], cell


def test_two_runs_of_one_release_hold_the_same_bytes_and_compare_clean(runs):
    """Attributed kinds are exact run to run; under FSDP the unattributed bytes (collective buffers freed as the
    other rank's data arrives) move by some tens of KB, under the rule's floor (docs/explanation/peak-memory.md)."""
    first, second = step_figures(runs["first"]), step_figures(runs["second"])
    for cell in CELLS:
        exact = {kind: first[cell][f"step_peak_bytes/{kind}"] for kind in ATTRIBUTED}
        assert exact == {kind: second[cell][f"step_peak_bytes/{kind}"] for kind in ATTRIBUTED}, cell
    done = compare(runs["first"], runs["second"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 memory figures grown past 1.25×" in done.stdout and MEMORY_SECTION not in done.stdout, done.stdout


def flagged_cells(done: subprocess.CompletedProcess, kind: str) -> set[str]:
    """The cells whose row of the diff's memory table names `kind` (compare exited 1)."""
    assert done.returncode == 1, done.stdout + done.stderr
    section = done.stdout.split(MEMORY_SECTION, 1)[1].split("\n#", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| `peak_memory` |")]
    return {row[3].strip("`") for row in rows if row[1:3] == [kind, f"`step_peak_bytes/{kind}`"]}


def test_checkpointing_dropped_silently_is_flagged_naming_the_activations(runs):
    reference, mutant = step_figures(runs["first"]), step_figures(runs["checkpointing_dropped"])
    for cell in CELLS:
        assert mutant[cell]["step_peak_bytes/activations"] > 1.25 * reference[cell]["step_peak_bytes/activations"], cell
    done = compare(runs["first"], runs["checkpointing_dropped"])
    assert flagged_cells(done, "activations") == set(CELLS), done.stdout


def test_a_policy_that_saves_every_op_is_flagged_naming_the_activations(runs):
    done = compare(runs["first"], runs["saving_every_op"])
    assert flagged_cells(done, "activations") == {COMPILED}, done.stdout
