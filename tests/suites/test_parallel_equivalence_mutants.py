"""The parallel_equivalence suite passes on the reference stack and on valid stacks of another shape,
and fails on each mutant of models/mutants/parallel_equivalence.py and tensor_parallel_plans.py, in
every cell kind it applies to.

One real `python -m torchmatrix run --torch system`, shared by every test here: FSDP1 and FSDP2 at
world size 2, HSDP and FSDP2 x tensor parallel at world size 4, each cell once per value of axis
`variant` (tests/suites/parallel_variants.py: the reference, a mutant, a valid plan of another shape),
so one rank pool per world size serves them all; the reference and the plan that needs depth are as deep
as the product builds their eager cells, every other cell one layer a stack (parallel_variants.build_model).
One more cell compiles its blocks (aot_eager, FSDP2 at world size 2, the reference): the single-process
reference must be named as built, before `parallelize` compiles it and its names gain `_orig_mod.`.
"""

from __future__ import annotations

import pytest

from helpers.checkout import REPO
from helpers.matrix_files import matrix_toml
from helpers.parallel_equivalence_tests import (
    ACCUMULATION,
    CLIP,
    DECLARED_DTYPE,
    EVERY_TEST,
    GRADIENTS,
    LOSSES,
    NORM,
)
from helpers.run_results import cell_properties, run_and_read

pytestmark = pytest.mark.slow

CELL_KINDS = ("ws2-fsdp1-flat", "ws2-fsdp2-flat", "ws4-fsdp2-hsdp", "ws4-fsdp2-fsdp_tp")
TENSOR_PARALLEL = "ws4-fsdp2-fsdp_tp"
TWO_SHARDS_EXACT = "bit for bit (at most two terms, no cast)"
EAGER = "none"
COMPILED = "ws2-fsdp2-flat-sdpa-adamw-reference-aot_eager"
"""The compiled parallel cell: its blocks and its single-process reference's, compiled alike."""

# variant -> per test that must fail in every cell where it runs, a text its failure must contain
MUTANTS = {
    "local_norm": {
        NORM: "the gradient norm clip_grad_norm returns is not the norm of the whole model's gradient",
        CLIP: "clipping did not scale the whole gradient by the coefficient of the whole norm",
    },
    "bf16_reductions": {
        GRADIENTS: "after the data-parallel reduction the gradient differs from the single-process mean gradient",
        DECLARED_DTYPE: "nonzero elements lie on the bfloat16 grid",
    },
}
# Components that divide by the world's size once more: a reference in the cell's world divided alike.
# The loss and the gradient follow from it, and the norm against the single-process mean's.
DIVIDED_LOSS = {
    LOSSES: "the parallel forward computes another loss than the single-process forward of the same shard",
    GRADIENTS: "after the data-parallel reduction the gradient differs from the single-process mean gradient",
    NORM: "|returned - single-process|",
}
WORLD_READERS = {
    "loss_over_world": DIVIDED_LOSS,
    "mesh_over_world": DIVIDED_LOSS,
    "model_over_world": DIVIDED_LOSS,
    "backward_over_world": {test: text for test, text in DIVIDED_LOSS.items() if test != LOSSES},
}
MUTANTS.update(WORLD_READERS)
# Tensor-parallel plans that sum a column-wise projection's input gradient twice, over the whole world,
# never, or twice past each stack's first layer (which needs two layers a stack): the loss is right,
# every gradient before that projection is not, nor the norm.
TENSOR_PARALLEL_PLANS = ("tp_grad_twice", "tp_grad_over_world", "tp_grad_never", "tp_grad_twice_deeper")
MUTANTS.update(
    dict.fromkeys(
        TENSOR_PARALLEL_PLANS,
        {GRADIENTS: "(its sign pattern)", NORM: "|returned - single-process|"},
    )
)
CONTROLS = ("mlp_only_plan",)
"""Valid stacks other than the reference that must pass every test: a tensor-parallel plan that splits the MLP only."""
TENSOR_PARALLEL_ONLY = (*TENSOR_PARALLEL_PLANS, *CONTROLS)
KINDS = (
    dict.fromkeys(MUTANTS, CELL_KINDS)
    | {
        "mesh_over_world": ("ws2-fsdp2-flat", TENSOR_PARALLEL),
        "model_over_world": ("ws2-fsdp2-flat", TENSOR_PARALLEL),
    }
    | dict.fromkeys(TENSOR_PARALLEL_ONLY, (TENSOR_PARALLEL,))
)
"""The cell kinds each variant runs in."""
CAUGHT_UNDER_TENSOR_PARALLELISM = {
    "local_norm": {NORM, CLIP},
    "bf16_reductions": {GRADIENTS, DECLARED_DTYPE},
}
"""Where the tensor-parallel cell catches a variant by fewer tests than the others: bf16 reductions
at two data-parallel shards are caught there too (both by the gradient's functionals and the grid);
the default is every test of MUTANTS."""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The one run: every cell kind times every variant; its per-cell outcomes, failures and JUnit."""
    root = tmp_path_factory.mktemp("parallel_equivalence")
    matrix = matrix_toml(
        axes={
            "world_size": [2, 4],
            "fsdp": ["fsdp1", "fsdp2"],
            "mesh": ["flat", "hsdp", "fsdp_tp"],
            "attn": ["sdpa"],
            "optimizer": ["adamw"],
            "variant": ["reference", *MUTANTS, *CONTROLS],
            "compile": [EAGER, "aot_eager"],
        },
        exclude=[
            {"mesh": "flat", "world_size": 4},
            {"mesh": ["hsdp", "fsdp_tp"], "world_size": 2},
            {"mesh": ["hsdp", "fsdp_tp"], "fsdp": "fsdp1"},
            {"compile": "aot_eager", "world_size": 4},
            {"compile": "aot_eager", "fsdp": "fsdp1"},
            {"compile": "aot_eager", "variant": [*MUTANTS, *CONTROLS]},
            {"variant": ["mesh_over_world", "model_over_world"], "fsdp": "fsdp1"},
            {"variant": ["mesh_over_world", "model_over_world"], "mesh": "hsdp"},
            {"variant": list(TENSOR_PARALLEL_ONLY), "mesh": ["flat", "hsdp"]},
        ],
        suites={"parallel_equivalence": {"path": None, "timeout": 300}},
        components={
            "model": "parallel_variants:build_model",
            "batch": "torchmatrix.models.transformer:make_batch",
            "parallelize": "parallel_variants:parallelize",
            "clip_grad_norm": "parallel_variants:clip_grad_norm",
            "training_step": "parallel_variants:training_step",
            "optimizer_adamw": "torchmatrix.models.optim:build_adamw",
        },
    )
    return run_and_read(root, matrix, components_from=REPO / "tests" / "suites")


def cells_of(outcomes: dict, variant: str) -> dict[str, dict[str, str]]:
    """The variant's eager cells by cell kind (ws2-fsdp1-flat, ...), each test -> outcome."""
    found = {
        cell.removesuffix(f"-sdpa-adamw-{variant}-{EAGER}"): tests
        for cell, tests in outcomes.items()
        if cell.endswith(f"-{variant}-{EAGER}")
    }
    assert set(found) == set(KINDS.get(variant, CELL_KINDS)), sorted(outcomes)
    return found


def reference(cell_kind: str) -> str:
    """The id of the cell kind's eager cell on the reference stack."""
    return f"{cell_kind}-sdpa-adamw-reference-{EAGER}"


@pytest.mark.parametrize("stack", ["reference", *CONTROLS])
def test_valid_stack_passes_every_cell(run, stack):
    done, outcomes, failures, junit = run
    assert "error" not in {result for tests in outcomes.values() for result in tests.values()}, done.stdout
    for kind, tests in cells_of(outcomes, stack).items():
        cell = f"{kind}-sdpa-adamw-{stack}-{EAGER}"
        expected = dict.fromkeys(EVERY_TEST, "passed") | {ACCUMULATION: "skipped"}
        assert tests == expected, f"{cell}: {tests}\n{failures.get(cell)}"


def test_reference_records_the_derived_tolerance(run):
    """Two shards reduce bit for bit; four carry the gamma bound, and the measured difference stays under
    it, as the tensor-parallel loss does under its first-order bound and every norm under the norm bound.
    Whether the tensor-parallel loss differs at all depends on the CPU's kernels (bit for bit on an AVX-512
    Xeon); its gradients' functionals always do, which shows the reference is not the cell itself."""
    junit = run[3]
    assert cell_properties(junit, reference("ws2-fsdp2-flat"))["precision"].endswith(TWO_SHARDS_EXACT)
    assert cell_properties(junit, reference("ws2-fsdp1-flat"))["grad_max_ulp"] == "0"
    assert cell_properties(junit, reference("ws2-fsdp1-flat"))["reference_world"] == "a world of one rank of its own"
    hsdp = cell_properties(junit, reference("ws4-fsdp2-hsdp"))
    assert "gamma_3" in hsdp["precision"], hsdp
    assert 0 < float(hsdp["grad_max_ratio"]) <= 1, hsdp
    tensor_parallel = cell_properties(junit, reference(TENSOR_PARALLEL))
    loss_ratio = float(tensor_parallel["loss_max_ratio"])
    assert 0 <= loss_ratio <= 1 and (loss_ratio == 0) == (float(tensor_parallel["loss_max_abs"]) == 0), tensor_parallel
    assert 0 < float(tensor_parallel["grad_functional_max_ratio"]) <= 1, tensor_parallel
    for kind in CELL_KINDS:
        recorded = cell_properties(junit, reference(kind))
        assert float(recorded["norm_max_rel"]) <= float(recorded["norm_tolerance_rel"]), recorded
        assert recorded["clipped_steps"].startswith("[0"), recorded


@pytest.mark.parametrize("variant", list(MUTANTS))
def test_suite_catches_mutant_in_every_cell(run, variant):
    done, outcomes, failures, _ = run
    for kind, tests in cells_of(outcomes, variant).items():
        cell = f"{kind}-sdpa-adamw-{variant}-{EAGER}"
        must_fail = {
            test: text
            for test, text in MUTANTS[variant].items()
            if kind != TENSOR_PARALLEL or test in CAUGHT_UNDER_TENSOR_PARALLELISM.get(variant, MUTANTS[variant])
        }
        assert must_fail, f"{variant} in {kind}: no test left to catch it"
        for test, text in must_fail.items():
            assert tests[test] == "failure", f"{variant} in {kind}: expected {test} to fail, outcomes {tests}"
            assert text in failures[cell][test], (
                f"{variant} in {kind}, {test} must say {text!r}:\n{failures[cell][test]}"
            )
        others = {test: result for test, result in tests.items() if test not in must_fail}
        assert set(others.values()) <= {"passed", "skipped"}, (
            f"{variant} is caught elsewhere too in {kind}: {others}\n{failures.get(cell)}"
        )


def test_compiled_cell_matches_its_compiled_reference(run):
    """A cell whose blocks `parallelize` compiles is compared parameter by parameter with a reference
    compiled alike, as exactly as its eager twin: the reference's names are taken as built (named after
    compiling, every one carried `_orig_mod.` and none matched the cell's)."""
    _, outcomes, failures, junit = run
    tests = outcomes[COMPILED]
    assert tests == dict.fromkeys(EVERY_TEST - {ACCUMULATION}, "passed") | {ACCUMULATION: "skipped"}, (
        f"{tests}\n{failures.get(COMPILED)}"
    )
    assert cell_properties(junit, COMPILED)["precision"].endswith(TWO_SHARDS_EXACT)
