"""The 2-D meshes (mesh = hsdp | fsdp_tp) at world size 4 on CPU with gloo, through the real CLI.

One run holds the reference stack's 2 x 2 cells under grad_ckpt, resume and dtensor_optim, where
every check passes (placements per mesh dim, state saved as its param's blocks, reshard 2 x 2 <-> 2
and 2 x 2 <-> 4), beside an HSDP cell of an optimizer whose state of a 2-D param is a 1-D DTensor
over the flattened mesh, which fails every dtensor_optim test. A second, one-test run swaps in a
`parallelize` whose tensor-parallel plan leaves o_proj replicated: it trains the same numbers, and
only the placement check sees it (models/mutants/meshes.py). The flattened-state optimizer's cell builds
the decoder one layer a stack deep (tests/suites/dtensor_variants.py), the reference's as the product does.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from junitparser import JUnitXml

from torchmatrix.models.transformer import SHALLOW_LAYERS_PER_STACK

from helpers.checkout import REPO
from helpers.matrix_files import REFERENCE_COMPONENTS, matrix_toml
from helpers.run_results import cell_failures, run_suites

pytestmark = pytest.mark.slow

REFERENCE, FLATTENED = "precision_aware", "flattened_state"
MESHES = ("hsdp", "fsdp_tp")
LAYOUT = "test_state_is_laid_out_like_its_param"
PARALLELIZE = "torchmatrix.models.parallel:parallelize"
O_PROJ_REPLICATED = "torchmatrix.models.mutants.meshes:parallelize_with_o_proj_replicated"
REFERENCE_MODEL = REFERENCE_COMPONENTS["model"]
VARIANTS_MODEL = "dtensor_variants:build_model"  # the flattened-state optimizer's cell one layer a stack


def mesh_matrix(
    parallelize: str = PARALLELIZE, optimizers=(REFERENCE, FLATTENED), meshes=MESHES, model: str = REFERENCE_MODEL
) -> str:
    """FSDP2 cells at world size 4 on these 2-D meshes; grad_ckpt and resume run the first optimizer
    only, the flattened-state optimizer runs on HSDP only (under fsdp_tp it fails the same way)."""
    optimizers = list(optimizers)
    return matrix_toml(
        axes={
            "world_size": [4],
            "fsdp": ["fsdp2"],
            "attn": ["sdpa"],
            "optimizer": optimizers,
            "mesh": list(meshes),
        },
        exclude=[{"optimizer": FLATTENED, "mesh": "fsdp_tp"}]
        if FLATTENED in optimizers and "fsdp_tp" in meshes
        else [],
        suites={
            "grad_ckpt": {"timeout": 300, "axes": ["world_size", "fsdp", "attn", "mesh"]},
            "resume": {
                "timeout": 300,
                "axes": ["world_size", "fsdp", "mesh"],
                "options": {"steps": 4, "resume_step": 2},
            },
            "dtensor_optim": {
                "timeout": 300,
                "axes": ["world_size", "fsdp", "optimizer", "mesh"],
                "options": {"bf16_param_optimizers": optimizers},
            },
        },
        components={
            **REFERENCE_COMPONENTS,
            "model": model,
            "parallelize": parallelize,
            "batch": "torchmatrix.models.transformer:make_batch",
            f"optimizer_{FLATTENED}": "torchmatrix.models.mutants.meshes:FlattenedMeshStateAdamW",
        },
    )


def cell_id(optimizer: str, mesh: str) -> str:
    return f"ws4-fsdp2-sdpa-{optimizer}-{mesh}"


@pytest.fixture(scope="module")
def run_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mesh_mutants")


@pytest.fixture(scope="module")
def run(run_root) -> tuple[subprocess.CompletedProcess, dict[str, dict[str, str]]]:
    """The reference stack and the flattened-state optimizer on both 2-D meshes; per cell id, test -> outcome."""
    return run_suites(run_root, mesh_matrix(model=VARIANTS_MODEL), REPO / "tests" / "suites")


def test_run_fails_and_reports_every_cell(run):
    done, outcomes = run
    assert done.returncode == 1, f"the mutant's cells must fail the run\n{done.stdout}{done.stderr}"
    assert set(outcomes) == {cell_id(REFERENCE, mesh) for mesh in MESHES} | {cell_id(FLATTENED, "hsdp")}


@pytest.mark.parametrize("mesh", MESHES)
def test_reference_passes_grad_ckpt_resume_and_dtensor_optim(run, mesh):
    tests = run[1][cell_id(REFERENCE, mesh)]
    assert set(tests.values()) <= {"passed", "skipped"}, tests
    ran = {test.split("[", 1)[0] for test, result in tests.items() if result == "passed"}
    assert {
        "test_checkpointing_leaves_loss_and_gradients_unchanged",
        "test_losses_identical_after_resume",
        "test_final_optimizer_state_identical",
        LAYOUT,
        "test_saved_state_is_sharded",
        "test_reshard_load_is_exact",
    } <= ran, tests


def test_reshards_cross_mesh_shapes_and_world_sizes(run, run_root):
    """Each reshard test of a 2-D cell moves between its mesh and both 1-D worlds: 2 ranks and 4."""
    junit = JUnitXml.fromfile(str(run_root / "reports" / "latest" / "junit.xml"))
    reshards = {
        (suite.name.split("/", 1)[1], prop.value)
        for suite in junit
        for prop in suite.properties()
        if prop.name.endswith("::reshards") and REFERENCE in suite.name
    }
    assert reshards == {
        (cell_id(REFERENCE, "hsdp"), "2x2 hsdp->2, 2x2 hsdp->4"),
        (cell_id(REFERENCE, "hsdp"), "2->2x2 hsdp, 4->2x2 hsdp"),
        (cell_id(REFERENCE, "fsdp_tp"), "2x2 fsdp_tp->2, 2x2 fsdp_tp->4"),
        (cell_id(REFERENCE, "fsdp_tp"), "2->2x2 fsdp_tp, 4->2x2 fsdp_tp"),
    }, reshards


def test_dtensor_optim_catches_hsdp_state_flattened_to_one_mesh_dim(run, run_root):
    """Every dtensor_optim test fails, on the model and on the probe; the layout check names the 1-D
    mesh the state claims against its param's 2-D one. (grad_ckpt and resume, which do not depend on
    the optimizer here, ran once per mesh with the reference optimizer and stand for this cell too.)"""
    cell = cell_id(FLATTENED, "hsdp")
    tests = run[1][cell]
    dtensor_optim = {test: result for test, result in tests.items() if "model_kind=" in test}
    assert len(dtensor_optim) == 8 and set(dtensor_optim.values()) == {"failure"}, tests
    failure = cell_failures(run_root / "reports" / "latest" / "torch-system")[cell][f"{LAYOUT}[model_kind=model]"]
    assert "(param [64, 32] (Replicate(), Shard(dim=0))) has mesh DeviceMesh((4,)" in failure, failure
    assert "expected DeviceMesh((dp_replicate=2, dp_shard=2)" in failure, failure


@pytest.fixture(scope="module")
def o_proj_replicated(tmp_path_factory) -> tuple[dict[str, str], dict[str, str]]:
    """The layout check alone, at fsdp_tp, with the parallelize whose plan leaves o_proj replicated."""
    root = tmp_path_factory.mktemp("o_proj_replicated")
    matrix = mesh_matrix(O_PROJ_REPLICATED, (REFERENCE,), ("fsdp_tp",))
    tests = [f"dtensor_optim::{LAYOUT}[model_kind={kind}]" for kind in ("model", "uneven_probe")]
    done, outcomes = run_suites(root, matrix, tests=tests)
    assert done.returncode == 1, done.stdout + done.stderr
    cell = cell_id(REFERENCE, "fsdp_tp")
    return outcomes[cell], cell_failures(root / "reports" / "latest" / "torch-system")[cell]


def test_dtensor_optim_catches_a_tp_plan_that_leaves_o_proj_replicated(o_proj_replicated):
    """o_proj lies on the dp_shard dim alone, where the plan splits it rowwise (Shard(1) on tp); the
    probe, which has no projections, passes."""
    tests, failures = o_proj_replicated
    assert tests == {f"{LAYOUT}[model_kind=model]": "failure", f"{LAYOUT}[model_kind=uneven_probe]": "passed"}
    failure = failures[f"{LAYOUT}[model_kind=model]"]
    assert "parameters placed otherwise than the fsdp_tp mesh {'dp_shard': 2, 'tp': 2} says" in failure, failure
    assert "ranks 0, 1, 2, 3: prefix_layers.0.o_proj.weight" in failure, failure
    assert "Replicate() on tp, expected Shard(dim=1) (the plan splits it rowwise)" in failure, failure
    misplaced = set(re.findall(r"ranks? [\d, ]+: (\S+) \(param", failure))
    depth = range(SHALLOW_LAYERS_PER_STACK)  # a 2-D mesh cell's decoder is the shallow one
    assert misplaced == {f"{stack}.{i}.o_proj.weight" for stack in ("prefix_layers", "expert_layers") for i in depth}
