"""examples/accelerate (nox -s accelerate_matrix) on CPU, through the real CLI: its FSDP2 cell at two
ranks, every suite. parallel_equivalence and dtensor_optim pass (FSDP2 found as accelerate leaves it,
sharded in place); grad_ckpt passes without dropout and fails with it, on the plugin's activation
checkpointing (examples/accelerate/prove_ac_dropout.py); resume restores the model, optimizer,
scheduler and RNG through `save_state` / `load_state` and fails on the shuffled loader's order and the
generator accelerate syncs it with (examples/accelerate/prove_shuffle_resume.py). Both accelerate's
bugs, kept red on purpose; docs/how-to/accelerate.md.

Needs accelerate and torchdata (`pip install accelerate==1.16.0 torchdata==0.11.0`, which `nox -s
tests` installs); without them the test skips saying so."""

from __future__ import annotations

import importlib.util

import pytest

from torchmatrix.matrix.config import load_matrix

from helpers.checkout import REPO
from helpers.matrix_files import matrix_toml
from helpers.run_results import cell_failures, run_suites

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        any(importlib.util.find_spec(name) is None for name in ("accelerate", "torchdata")),
        reason="needs accelerate and torchdata: pip install accelerate==1.16.0 torchdata==0.11.0 (nox -s tests installs them)",
    ),
]

EXAMPLE = REPO / "examples" / "accelerate"
ACCELERATE = load_matrix(EXAMPLE / "matrix.toml")
CELL = "ws2-fsdp2-sdpa-adamw"
AFTER_LOAD = "resume::test_state_restored_right_after_load[piece={}]"
FAILING = {
    "grad_ckpt::test_checkpointing_leaves_loss_and_gradients_unchanged[dropout=0.1]": (
        "checkpointing changed the loss or gradients (dropout=0.1; with checkpointing first, without second)"
    ),
    AFTER_LOAD.format(
        "loader"
    ): "rank 0: after load: loader would yield a batch the straight run never read, saved at batch 4",
    AFTER_LOAD.format("rng"): "after load: RNG stream loader.synchronized_generator differs from the saved one",
    "resume::test_losses_identical_after_resume": "loss at step 5 (resumed at 4)",
    "resume::test_final_parameters_identical": "final parameters, straight vs resumed",
    "resume::test_final_optimizer_state_identical": "final optimizer state, straight vs resumed",
}
PASSING = (
    "grad_ckpt::test_checkpointing_leaves_loss_and_gradients_unchanged[dropout=0.0]",
    "grad_ckpt::test_recompute_reruns_layers_and_rewrites_cache_identically",
    *(AFTER_LOAD.format(piece) for piece in ("parameters", "optimizer_state", "param_groups", "scheduler")),
    "parallel_equivalence::test_losses_match_single_process",
    "parallel_equivalence::test_reduced_gradients_match_single_process",
    "parallel_equivalence::test_parameters_match_single_process_step",
    "dtensor_optim::test_saved_state_is_sharded[model_kind=model]",
    "dtensor_optim::test_reshard_load_is_exact[model_kind=model,reshard=shrink]",
)


@pytest.fixture(scope="module")
def fsdp2_cell(tmp_path_factory):
    """The FSDP2 cell's run: the process, {test: outcome} and {test: failure text}, tests named suite::test."""
    root = tmp_path_factory.mktemp("accelerate")
    matrix = matrix_toml(
        axes={"world_size": [2], "fsdp": ["fsdp2"], "attn": ["sdpa"], "optimizer": ["adamw"]},
        suites={name: {"timeout": 300, "axes": suite.axes} for name, suite in ACCELERATE.suites.items()},
        components=ACCELERATE.components,
    )
    done, outcomes = run_suites(root, matrix, EXAMPLE, timeout=900)
    failures = cell_failures(root / "reports" / "latest" / "torch-system")
    return done, outcomes[CELL], failures.get(CELL, {})


def unqualified(name: str) -> str:
    """`suite::test[params]` as a cell's outcomes name it: without its suite."""
    return name.split("::", 1)[1]


def test_accelerate_fsdp2_fails_exactly_on_its_two_bugs(fsdp2_cell):
    done, outcomes, failures = fsdp2_cell
    assert done.returncode == 1, done.stdout + done.stderr
    failed = {test for test, outcome in outcomes.items() if outcome in ("failure", "error")}
    assert failed == set(map(unqualified, FAILING)), outcomes
    for name, line in FAILING.items():
        assert line in failures[unqualified(name)], failures[unqualified(name)]


def test_accelerate_fsdp2_passes_what_it_keeps(fsdp2_cell):
    _, outcomes, _ = fsdp2_cell
    for name in PASSING:
        assert outcomes[unqualified(name)] == "passed", (name, outcomes)
