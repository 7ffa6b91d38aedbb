"""The dtensor_optim suite is only worth running if it fails on the bugs it exists for: run it
through the real CLI on CPU at world sizes 2 and 4 with FSDP2, where the reference
precision-aware optimizer passes every cell and each mutant of models/mutants/dtensor_state.py
fails the checks that should see it.

The mutants ride along as extra values of the `optimizer` axis (one component each), so a
single run with one rank pool per world size covers them all.
"""

from __future__ import annotations

import subprocess

import pytest

from conftest import matrix_toml, run_suites

pytestmark = pytest.mark.slow

REFERENCE = "precision_aware"
NEVER_SKIPPED_ON_FSDP2 = ("test_state_is_laid_out_like_its_param", "test_saved_state_is_sharded")

# optimizer axis value -> (component, model kinds on which every test that runs must fail);
# the shapeless mutant is only wrong where shards are uneven, so only the probe sees it
MUTANTS = {
    "plain_local_state": ("models.mutants.dtensor_state:PlainLocalStateAdamW", ("model", "uneven_probe")),
    "replicated_state": ("models.mutants.dtensor_state:ReplicatedStateAdamW", ("model", "uneven_probe")),
    "shapeless_state": ("models.mutants.dtensor_state:ShapelessStateAdamW", ("uneven_probe",)),
}
WORLD_SIZES = (2, 4)


def dtensor_matrix() -> str:
    """FSDP2 cells of every world size, the reference optimizer and each mutant as the optimizer axis."""
    optimizers = [REFERENCE, *MUTANTS]
    components = {
        "model": "models.transformer:build_model",
        "batch": "models.transformer:make_batch",
        "parallelize": "models.parallel:parallelize",
        f"optimizer_{REFERENCE}": "models.optim:build_precision_aware",
        **{f"optimizer_{name}": path for name, (path, _) in MUTANTS.items()},
    }
    return matrix_toml(
        axes={"world_size": list(WORLD_SIZES), "fsdp": ["fsdp2"], "attn": ["sdpa"], "optimizer": optimizers},
        suites={
            "dtensor_optim": {
                "timeout": 120,
                "axes": ["world_size", "fsdp", "optimizer"],
                "options": {"bf16_param_optimizers": optimizers},
            }
        },
        components=components,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict[str, dict[str, str]]]:
    """One run of the suite over reference and mutant cells; per cell id, test -> outcome."""
    return run_suites(tmp_path_factory.mktemp("dtensor_mutants"), dtensor_matrix())


def cell_id(world_size: int, optimizer: str) -> str:
    return f"ws{world_size}-fsdp2-sdpa-{optimizer}"


def test_run_fails_and_reports_every_cell(run):
    done, outcomes = run
    assert done.returncode == 1, f"mutant cells must fail the run\n{done.stdout}{done.stderr}"
    assert set(outcomes) == {cell_id(ws, opt) for ws in WORLD_SIZES for opt in [REFERENCE, *MUTANTS]}, done.stdout


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_reference_passes(run, world_size):
    tests = run[1][cell_id(world_size, REFERENCE)]
    assert tests and set(tests.values()) <= {"passed", "skipped"}, tests
    assert "passed" in tests.values(), tests


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_suite_catches_mutant(run, mutant, world_size):
    tests = run[1][cell_id(world_size, mutant)]
    print(f"{mutant} x ws{world_size}: failed {sorted(test for test, result in tests.items() if result == 'failure')}")
    assert "error" not in tests.values(), f"{mutant} crashed the suite instead of failing its checks: {tests}"
    kinds = MUTANTS[mutant][1]
    watching = {test: result for test, result in tests.items() if any(f"model_kind={kind}" in test for kind in kinds)}
    for check in NEVER_SKIPPED_ON_FSDP2:
        assert any(test.startswith(check) for test in watching), f"{check} did not run: {tests}"
    missed = sorted(test for test, result in watching.items() if result not in ("failure", "skipped"))
    assert not missed, f"{mutant} at ws{world_size}: expected {missed} to fail, outcomes {tests}"
