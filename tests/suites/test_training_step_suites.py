"""grad_ckpt and parallel_equivalence train through the stack's `training_step` component, as resume
and dtensor_optim do: on a stack whose wrapper refuses a plain `loss.backward()` (Fabric's shape under
FSDPStrategy, models/trainer_held.py's `OwnBackwardModule`), both run the stack's own backward
(`OwnBackwardStep`) and pass, in one small cell (world size 2, FSDP2, one test of each)."""

from __future__ import annotations

import pytest
import torch

from torchmatrix.models.trainer_held import OwnBackwardModule, OwnBackwardStep
from torchmatrix.models.transformer import build_model, make_batch

from helpers.matrix_files import matrix_toml
from helpers.run_results import cell_failures, run_suites

CELL = {"fsdp": "none", "attn": "sdpa"}
TESTS = {
    "grad_ckpt": "test_checkpointing_leaves_loss_and_gradients_unchanged[dropout=0.0]",
    "parallel_equivalence": "test_reduced_gradients_match_single_process",
}


def test_the_stack_refuses_a_plain_backward_and_takes_its_own():
    """The known-bad way for this stack, a suite calling `loss.backward()` itself, raises; its step's backward runs."""
    model = OwnBackwardModule(build_model(CELL))
    batch = make_batch(model, seed=0, device=torch.device("cpu"))
    with pytest.raises(RuntimeError, match="call its own backward"):
        model(**batch).loss.backward()
    model.zero_grad(set_to_none=True)
    OwnBackwardStep(model=model, optimizer=None).backward(model(**batch).loss)
    assert all(param.grad is not None for param in model.parameters())


@pytest.mark.slow
def test_grad_ckpt_and_parallel_equivalence_run_the_stacks_own_backward(tmp_path):
    components = {
        "model": "torchmatrix.models.transformer:build_model",
        "batch": "torchmatrix.models.transformer:make_batch",
        "parallelize": "torchmatrix.models.trainer_held:parallelize_own_backward",
        "optimizer_adamw": "torchmatrix.models.optim:build_adamw",
        "training_step": "torchmatrix.models.trainer_held:OwnBackwardStep",
    }
    matrix = matrix_toml(
        axes={"world_size": [2], "fsdp": ["fsdp2"], "attn": ["sdpa"], "optimizer": ["adamw"]},
        suites={suite: {"timeout": 300} for suite in TESTS},
        components=components,
    )
    done, outcomes = run_suites(tmp_path, matrix, tests=[f"{suite}::{test}" for suite, test in TESTS.items()])
    failures = cell_failures(tmp_path / "reports" / "latest" / "torch-system")
    assert done.returncode == 0, f"{failures}\n{done.stdout}{done.stderr}"
    assert outcomes == {"ws2-fsdp2-sdpa-adamw": dict.fromkeys(TESTS.values(), "passed")}, outcomes
