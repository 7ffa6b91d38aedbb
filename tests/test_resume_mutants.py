"""The resume suite is only worth running if it fails on the bugs it exists for: run it through
the real CLI on CPU, once with the reference components (every cell passes) and once per
mutant of models/mutants/resume.py (every applicable cell fails, on the checks that should
see that bug, and none errors out).

Cells: world size 1 without FSDP and world size 2 with FSDP2, for both optimizers; the
cast-on-load mutant only exists for precision_aware.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import run_suites

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
MOMENTS = "test_moments_restored_before_first_step"
LOSSES = "test_losses_identical_after_resume"
PARAMETERS = "test_final_parameters_identical"
STATE = "test_final_optimizer_state_identical"

# mutant -> (component overrides, optimizers it applies to, tests that must fail in every cell)
MUTANTS = {
    "raw_optimizer_state_dict": (
        {"checkpointer": "models.mutants.resume:RawOptimizerStateCheckpointer"},
        BOTH_OPTIMIZERS,
        {MOMENTS, LOSSES, PARAMETERS, STATE},
    ),
    "rng_not_restored": (
        {"checkpointer": "models.mutants.resume:RngNotRestoredCheckpointer"},
        BOTH_OPTIMIZERS,
        {LOSSES, PARAMETERS, STATE},
    ),
    "scheduler_not_restored": (
        {"checkpointer": "models.mutants.resume:SchedulerNotRestoredCheckpointer"},
        BOTH_OPTIMIZERS,
        {LOSSES, PARAMETERS, STATE},
    ),
    "data_position_not_restored": (
        {"checkpointer": "models.mutants.resume:DataPositionNotRestoredCheckpointer"},
        BOTH_OPTIMIZERS,
        {LOSSES, PARAMETERS, STATE},
    ),
    "precision_aware_cast_on_load": (
        {"optimizer_precision_aware": "models.mutants.resume:build_cast_on_load_precision_aware"},
        ("precision_aware",),
        {MOMENTS, LOSSES, PARAMETERS, STATE},
    ),
}


def matrix_toml(components: dict[str, str], optimizers: tuple[str, ...]) -> str:
    """ws1 without FSDP and ws2 with FSDP2, for the given optimizers, with these components."""
    quoted = lambda values: ", ".join(f'"{v}"' for v in values)  # noqa: E731
    return f"""
[torch]
versions = ["system"]

[axes]
world_size = [1, 2]
fsdp = ["none", "fsdp2"]
attn = ["sdpa"]
optimizer = [{quoted(optimizers)}]

[[exclude]]
fsdp = "none"
world_size = 2

[[exclude]]
fsdp = "fsdp2"
world_size = 1

[suites.resume]
path = "suites/test_resume.py"
timeout = 240
axes = ["world_size", "fsdp", "optimizer"]

[components]
{chr(10).join(f'{name} = "{path}"' for name, path in components.items())}
"""


def run_resume_suite(
    root: Path, components: dict[str, str], optimizers: tuple[str, ...]
) -> tuple[subprocess.CompletedProcess, dict]:
    """Run the suite through `python -m torchmatrix run`; return the process and, per cell, test -> outcome."""
    return run_suites(root, matrix_toml(components, optimizers))


def expected_cells(optimizers: tuple[str, ...]) -> set[str]:
    return {f"{prefix}-sdpa-{optimizer}" for prefix in ("ws1-none", "ws2-fsdp2") for optimizer in optimizers}


def test_reference_components_pass_every_cell(tmp_path):
    done, outcomes = run_resume_suite(tmp_path / "reference", REFERENCE_COMPONENTS, BOTH_OPTIMIZERS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(outcomes) == expected_cells(BOTH_OPTIMIZERS), done.stdout
    for cell, tests in outcomes.items():
        assert tests and set(tests.values()) == {"passed"}, f"{cell}: {tests}"


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_suite_catches_mutant_in_every_cell(tmp_path, mutant):
    overrides, optimizers, must_fail = MUTANTS[mutant]
    done, outcomes = run_resume_suite(tmp_path / mutant, {**REFERENCE_COMPONENTS, **overrides}, optimizers)
    assert done.returncode == 1, f"{mutant}: expected the run to fail\n{done.stdout}{done.stderr}"
    assert set(outcomes) == expected_cells(optimizers), done.stdout
    for cell, tests in outcomes.items():
        print(f"{mutant} x {cell}: failed {sorted(test for test, result in tests.items() if result == 'failure')}")
    for cell, tests in outcomes.items():
        assert "error" not in tests.values(), (
            f"{mutant} in {cell} crashed the suite instead of failing its checks: {tests}"
        )
        missed = {test for test in must_fail if tests.get(test) != "failure"}
        assert not missed, f"{mutant} in {cell}: expected {sorted(missed)} to fail, outcomes {tests}"
