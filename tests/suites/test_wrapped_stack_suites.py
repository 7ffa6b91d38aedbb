"""grad_ckpt, parallel_equivalence and dtensor_optim on the reference stack held as Lightning Fabric
holds a LightningModule (tests/suites/wrapped_stacks.py): FSDP1 under a trainer's wrapper is found
there (its root gathers, clips and saves; names read as the user's model gives them), and a training
step that calls the model's own `training_step` method instead of the model is checked like one that
calls the model. Before, FSDP1 was recognised only as the top module (parallel_equivalence errored
on the flat shards, dtensor_optim's sharded-save test raised KeyError on a `_forward_module.` name)
and grad_ckpt raised KeyError: 'output' when no hook on the model's own call fired."""

from __future__ import annotations

import pytest

from helpers.checkout import REPO
from helpers.matrix_files import matrix_toml
from helpers.run_results import cell_failures, run_suites

COMPONENTS = {
    "model": "wrapped_stacks:build_step_model",
    "batch": "torchmatrix.models.transformer:make_batch",
    "parallelize": "wrapped_stacks:parallelize_fabric_like",
    "optimizer_adamw": "torchmatrix.models.optim:build_adamw",
    "training_step": "wrapped_stacks:MethodStep",
}
TESTS = {
    "grad_ckpt": (
        "test_checkpointing_leaves_loss_and_gradients_unchanged[dropout=0.0]",
        "test_recompute_reruns_layers_and_rewrites_cache_identically",
    ),
    "parallel_equivalence": ("test_reduced_gradients_match_single_process", "test_gradient_norm_is_the_whole_models"),
    "dtensor_optim": ("test_saved_state_is_sharded[model_kind=model]",),
}


@pytest.mark.slow
def test_fsdp1_under_a_trainers_wrapper_with_a_method_calling_step(tmp_path):
    matrix = matrix_toml(
        axes={"world_size": [2], "fsdp": ["fsdp1"], "attn": ["sdpa"], "optimizer": ["adamw"]},
        suites={suite: {"timeout": 300} for suite in TESTS},
        components=COMPONENTS,
    )
    tests = [f"{suite}::{test}" for suite, names in TESTS.items() for test in names]
    done, outcomes = run_suites(tmp_path, matrix, REPO / "tests" / "suites", tests=tests)
    failures = cell_failures(tmp_path / "reports" / "latest" / "torch-system")
    assert done.returncode == 0, f"{failures}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    expected = {test: "passed" for names in TESTS.values() for test in names}
    assert outcomes == {"ws2-fsdp1-sdpa-adamw": expected}, outcomes
