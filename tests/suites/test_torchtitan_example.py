"""A small selection of examples/torchtitan (nox -s titan_matrix) on CPU, through the real CLI:
grad_ckpt and resume on torchtitan's own Llama 3 debug model, parallelize_llama, CheckpointManager
(the bound checkpointer form) and LRSchedulersContainer (the scheduler component) at ws1 without
FSDP and ws2 with FSDP2 (SDPA, split QKV), plus the debug model as shipped (fused QKV) at ws1, and
torchtitan's own `exclude_from_loading = ["optimizer", "lr_scheduler"]` caught on both pieces.

Needs torchtitan's minimal set (examples/torchtitan/requirements-minimal.txt, installed with
--no-deps by `nox -s tests`); without it the tests skip saying so, and fail instead where
TORCHMATRIX_REQUIRE_TORCHTITAN=1 (.ci/run). The full matrix and its table are in docs/how-to/torchtitan.md."""

from __future__ import annotations

import importlib.util
import os

import pytest

from torchmatrix.matrix.config import load_matrix

from helpers.checkout import REPO
from helpers.matrix_files import matrix_toml
from helpers.run_results import cell_failures, run_suites

pytestmark = pytest.mark.slow

TITAN = load_matrix(REPO / "examples" / "torchtitan" / "matrix.toml")
MINIMAL = "examples/torchtitan/requirements-minimal.txt"
EXAMPLE = REPO / "examples" / "torchtitan"
MISSING = [name for name in ("torchtitan", "spmd_types", "tyro", "triton") if importlib.util.find_spec(name) is None]


@pytest.fixture(autouse=True)
def torchtitan_installed():
    if not MISSING:
        return
    reason = f"needs {', '.join(MISSING)}: pip install --no-deps -r {MINIMAL} (nox -s tests installs it)"
    if os.environ.get("TORCHMATRIX_REQUIRE_TORCHTITAN") == "1":
        pytest.fail(f"TORCHMATRIX_REQUIRE_TORCHTITAN=1, but this test {reason}")
    pytest.skip(reason)


def titan_matrix(suites: tuple[str, ...], qkv: list[str], world_sizes=(1, 2), **overrides: str) -> str:
    """ws1 without FSDP and ws2 with FSDP2 (of `world_sizes`), SDPA, over `qkv`, with the example's
    components; fused QKV only at ws1."""
    fsdp = ["none", "fsdp2"][: len(world_sizes)]
    wide = 2 in world_sizes
    return matrix_toml(
        axes={"world_size": list(world_sizes), "fsdp": fsdp, "attn": ["sdpa"], "qkv": qkv, "optimizer": ["adamw"]},
        exclude=[
            *([{"fsdp": "none", "world_size": 2}, {"fsdp": "fsdp2", "world_size": 1}] if wide else []),
            *([{"qkv": "fused", "world_size": 2}] if "fused" in qkv and wide else []),
        ],
        suites={
            name: {"timeout": 300, "axes": TITAN.suites[name].axes, "options": TITAN.suites[name].table}
            for name in suites
        },
        components={**TITAN.components, **overrides},
    )


NO_CACHE = "test_recompute_reruns_layers_and_rewrites_cache_identically"
FUSED_QKV_STATE_DICT = "AttributeError: 'FusedQKVLinear' object has no attribute 'wq'"


def test_grad_ckpt_and_resume_on_torchtitans_stack(tmp_path):
    """Split QKV: checkpointing is bit-exact and resume is exact in both cells; the model keeps no
    KV cache and has no dropout, so the cache test and the dropout variant skip, saying so. Fused
    QKV (as shipped): every resume test errors, because torch's get_model_state_dict cannot resolve
    the wq/wk/wv keys FusedQKVLinear's state-dict hook writes."""
    done, outcomes = run_suites(tmp_path, titan_matrix(("grad_ckpt", "resume"), ["fused", "split"]), EXAMPLE)
    split = ("ws1-none-sdpa-split-adamw", "ws2-fsdp2-sdpa-split-adamw")
    assert set(outcomes) == {*split, "ws1-none-sdpa-fused-adamw"}, done.stdout + done.stderr
    for cell in split:
        failed = {test: outcome for test, outcome in outcomes[cell].items() if outcome in ("failure", "error")}
        assert not failed, (cell, failed)
        for test in (NO_CACHE, "test_checkpointing_leaves_loss_and_gradients_unchanged[dropout=0.1]"):
            assert outcomes[cell][test] == "skipped", (cell, outcomes[cell])
        for test in (
            "test_checkpointing_leaves_loss_and_gradients_unchanged[dropout=0.0]",
            "test_final_optimizer_state_identical",
        ):
            assert outcomes[cell][test] == "passed", (cell, outcomes[cell])
    fused = outcomes["ws1-none-sdpa-fused-adamw"]
    resume_tests = [
        test
        for test in fused
        if not test.startswith(("test_checkpointing", "test_recompute", "test_micro", "test_compiled", "test_forward"))
    ]
    assert resume_tests and all(fused[test] == "error" for test in resume_tests), fused
    assert FUSED_QKV_STATE_DICT in done.stdout, done.stdout


def test_resume_catches_torchtitans_optimizer_and_schedule_excluded_from_loading(tmp_path):
    """At ws1 only: the manager's `exclude_from_loading` drops both pieces on every rank alike."""
    text = titan_matrix(
        ("resume",), ["split"], world_sizes=(1,), checkpointer="mutants:FreshOptimizerAndScheduleCheckpointer"
    )
    done, outcomes = run_suites(tmp_path, text, EXAMPLE)
    cell = "ws1-none-sdpa-split-adamw"
    assert done.returncode == 1, done.stdout + done.stderr
    assert set(outcomes) == {cell}, outcomes
    messages = cell_failures(tmp_path / "reports" / "latest" / "torch-system")[cell]
    for piece, line in (
        ("optimizer_state", "after load: optimizer state "),
        ("scheduler", "after load: scheduler state_dict is {'last_epoch': 0}"),
    ):
        test = f"test_state_restored_right_after_load[piece={piece}]"
        assert outcomes[cell][test] == "failure", outcomes
        assert line in messages[test], messages[test]
