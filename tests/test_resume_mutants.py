"""The resume suite is only worth running if it fails on the bugs it exists for: run it through
the real CLI on CPU, once with the reference components (every cell passes) and once per
mutant of models/mutants/resume.py: every applicable cell fails, each mutant with its own
named message from the right-after-load check of the piece it lost, and none errors out.

Cells: world size 1 without FSDP and world size 2 with FSDP1 and FSDP2, adamw; the reference
also with precision_aware, which the cast-on-load mutant needs.
"""

from __future__ import annotations

import pytest

from conftest import cell_failures, matrix_toml, run_suites

pytestmark = pytest.mark.slow

REFERENCE_COMPONENTS = {
    "model": "models.transformer:build_model",
    "parallelize": "models.parallel:parallelize",
    "optimizer_adamw": "models.optim:build_adamw",
    "optimizer_precision_aware": "models.optim:build_precision_aware",
    "checkpointer": "models.checkpoint:Checkpointer",
    "dataset": "models.data:TokenDataset",
}
BOTH_OPTIMIZERS = ("adamw", "precision_aware")
CELL_PREFIXES = ("ws1-none", "ws2-fsdp1", "ws2-fsdp2")
LOSSES = "test_losses_identical_after_resume"
PARAMETERS = "test_final_parameters_identical"
STATE = "test_final_optimizer_state_identical"


def after_load(piece: str) -> str:
    return f"test_state_restored_right_after_load[piece={piece}]"


# mutant -> (component overrides, optimizers, cell prefixes, tests that must fail -> text the failure names)
MUTANTS = {
    "raw_optimizer_state_dict": (
        {"checkpointer": "models.mutants.resume:RawOptimizerStateCheckpointer"},
        ("adamw",),
        CELL_PREFIXES,
        {after_load("optimizer_state"): "after load: optimizer state exp_avg of ", LOSSES: "loss at step"},
    ),
    "rng_not_restored": (
        {"checkpointer": "models.mutants.resume:RngNotRestoredCheckpointer"},
        ("adamw",),
        CELL_PREFIXES,
        {after_load("rng"): "after load: RNG stream torch CPU differs from the saved one", LOSSES: "loss at step"},
    ),
    "scheduler_not_restored": (
        {"checkpointer": "models.mutants.resume:SchedulerNotRestoredCheckpointer"},
        ("adamw",),
        CELL_PREFIXES,
        {after_load("scheduler"): "after load: scheduler last_epoch is 0, saved 3", LOSSES: "loss at step"},
    ),
    "scheduler_one_step_late": (
        {"checkpointer": "models.mutants.resume:SchedulerOneStepLateCheckpointer"},
        ("adamw",),
        CELL_PREFIXES,
        {after_load("scheduler"): "after load: scheduler last_epoch is 4, saved 3", LOSSES: "loss at step"},
    ),
    "data_position_not_restored": (
        {"checkpointer": "models.mutants.resume:DataPositionNotRestoredCheckpointer"},
        ("adamw",),
        CELL_PREFIXES,
        {after_load("loader"): "after load: loader would yield batch 0, saved at batch 3", LOSSES: "loss at step"},
    ),
    "loader_one_batch_late": (
        {"checkpointer": "models.mutants.resume:LoaderOneBatchLateCheckpointer"},
        ("adamw",),
        CELL_PREFIXES,
        {after_load("loader"): "after load: loader would yield batch 4, saved at batch 3", LOSSES: "loss at step"},
    ),
    "rank_zero_only": (
        {"checkpointer": "models.mutants.resume:RankZeroOnlyCheckpointer"},
        ("adamw",),
        ("ws2-fsdp1", "ws2-fsdp2"),
        {
            after_load("parameters"): "rank 1: after load: parameter ",
            after_load("optimizer_state"): "rank 1: after load: optimizer state ",
        },
    ),
    "precision_aware_cast_on_load": (
        {"optimizer_precision_aware": "models.mutants.resume:build_cast_on_load_precision_aware"},
        ("precision_aware",),
        CELL_PREFIXES,
        {after_load("optimizer_state"): "is torch.bfloat16, saved torch.float32", LOSSES: "loss at step"},
    ),
}


def resume_matrix(components: dict[str, str], optimizers: tuple[str, ...]) -> str:
    """ws1 without FSDP and ws2 with FSDP1 and FSDP2, for the given optimizers, with these components."""
    return matrix_toml(
        axes={
            "world_size": [1, 2],
            "fsdp": ["none", "fsdp1", "fsdp2"],
            "attn": ["sdpa"],
            "optimizer": list(optimizers),
        },
        exclude=[{"fsdp": "none", "world_size": 2}, {"fsdp": ["fsdp1", "fsdp2"], "world_size": 1}],
        suites={
            "resume": {
                "timeout": 240,
                "axes": ["world_size", "fsdp", "optimizer"],
                "options": {"steps": 6, "resume_step": 3},
            }
        },
        components=components,
    )


def expected_cells(prefixes: tuple[str, ...], optimizers: tuple[str, ...]) -> set[str]:
    return {f"{prefix}-sdpa-{optimizer}" for prefix in prefixes for optimizer in optimizers}


def test_reference_components_pass_every_cell(tmp_path):
    done, outcomes = run_suites(tmp_path / "reference", resume_matrix(REFERENCE_COMPONENTS, BOTH_OPTIMIZERS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(outcomes) == expected_cells(CELL_PREFIXES, BOTH_OPTIMIZERS), done.stdout
    for cell, tests in outcomes.items():
        assert {after_load(piece) for piece in ("parameters", "optimizer_state", "rng")} <= set(tests), tests
        assert tests and set(tests.values()) == {"passed"}, f"{cell}: {tests}"


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_suite_catches_mutant_in_every_cell(tmp_path, mutant):
    overrides, optimizers, prefixes, must_fail = MUTANTS[mutant]
    done, outcomes = run_suites(tmp_path / mutant, resume_matrix({**REFERENCE_COMPONENTS, **overrides}, optimizers))
    failures = cell_failures(tmp_path / mutant / "reports" / "latest" / "torch-system")
    assert done.returncode == 1, f"{mutant}: expected the run to fail\n{done.stdout}{done.stderr}"
    assert set(outcomes) == expected_cells(CELL_PREFIXES, optimizers), done.stdout
    for cell, tests in outcomes.items():
        assert "error" not in tests.values(), (
            f"{mutant} in {cell} crashed the suite instead of failing its checks: {tests}"
        )
        if not cell.startswith(prefixes):
            assert set(tests.values()) == {"passed"}, f"{mutant} is correct in {cell}, yet: {failures[cell]}"
            continue
        for test, text in must_fail.items():
            assert tests.get(test) == "failure", f"{mutant} in {cell}: expected {test} to fail, outcomes {tests}"
            assert text in failures[cell][test], (
                f"{mutant} in {cell}, {test} must say {text!r}:\n{failures[cell][test]}"
            )
