"""The grad-ckpt suite's compiled cells that need only the gradient comparisons (single step and
micro-batches), in one real run whose axis `variant` picks the components per cell
(tests/suites/grad_ckpt_variants.py):

- a block whose compiled recompute is not the graph its forward ran
  (models/mutants/compiled_recompute.py): compiled inside the checkpointed region, the recompute fails
  a guard and runs another graph, and the failure names the checkpoint unit, the compile mode and
  torch's CheckpointError; compiled around the checkpointed block, recompute runs in the graph the
  forward traced, so the same block is consistent and passes;
- a parallelize that compiles the blocks without ever switching checkpointing on: in a compiled cell no
  Python body runs again in backward, so the suite shows checkpointing applied by what autograd saved;
  both steps save the same, and the gradient tests fail saying checkpointing was not applied, with the
  saved bytes;
- blocks checkpointed under a selective-checkpoint policy that saves every op: applied, saving more
  than without, recomputing nothing; the failure names the policy;
- models that compute something else once compiled (models/mutants/eager_twin.py: a buffer updated only
  when not compiling, a value or a flag Dynamo bakes in at the first trace, another op under
  `is_compiling()`, a cache entry memoised from the first layer traced, which needs two layers a
  stack), each in the aot_eager cell: each fails the eager-twin comparison naming the first
  tensor that differs, its step and the tensor that differs most; the valid control, a block with a
  benign graph break compiled with `fullgraph=False`, passes. They run as a second run, of the eager-twin
  test alone: `--test` narrows a whole run, and in the first one the two checkpointing tests would
  compile each mutant's static and dynamic-shape graphs for nothing (the module took 282 s that way
  and 145 s before the mutants, on the shared 2-core machine at load 7 to 8; as two runs, 123 s against
  77 s at load 3 to 4); docs/explanation/compile.md has what a standalone script and a run of the
  checkpointing tests showed of their consistency with themselves;
- the one inductor cell in CI (inductor on CPU compiles C++ for tens of seconds per graph): the reference
  components pass within the derived float32 reordering tolerance that the precision property names,
  and within the eager twin's derived bound, with the ULP distance, the share of the bound used and the
  compile seconds recorded.

Every variant but the one that needs depth builds the decoder one layer a stack deep (axis
`layers_per_stack`, DEEP_ENOUGH): a third of the compile seconds of two. The reference components pass
the aot_eager cells in tests/suites/test_grad_ckpt_compile.py as deep as the product builds them, the
eager twin included: the control at the depth that first_entry_model needs.
"""

from __future__ import annotations

import pytest

from suites.recompute.grad_ckpt_precision import REORDER_RTOL
from suites.references.eager_twin import STEP_RTOL

from helpers.checkout import REPO
from helpers.grad_ckpt_runs import (
    EAGER_TWIN,
    GRADIENTS,
    MICRO_BATCHES,
    compile_seconds,
    compiled_variants_matrix,
    failure_text,
    run_suite,
)

pytestmark = pytest.mark.slow

MUTANT, UNAPPLIED, REFERENCE = "recompute_switching_model", "checkpoint_dropping_parallelize", "reference"
SAVING_EVERY_OP = "every_op_saving_model"
INSIDE, OUTSIDE = "ws1-none-sdpa-aot_eager-inside", "ws1-none-sdpa-aot_eager-outside"
INDUCTOR = "ws1-none-sdpa-inductor-outside"
# models/mutants/eager_twin.py's factories: what the eager-twin failure must say, first and largest.
TWIN_MUTANTS = {
    "eager_counting_model": ("first at step 1 of 3, rank 0: buffer prefix_layers.0.calls: is 0, eager 1",),
    "eager_statistic_model": (
        "first at step 1 of 3, rank 0: buffer prefix_layers.0.input_mean_square: is 1.0, eager 1.00",
    ),
    "constant_warmup_model": (
        "first at step 2 of 3, rank 0: the loss: is ",
        "largest that step: rank 0: gradient of prefix_layers.0.",
    ),
    "constant_flag_model": (
        "first at step 2 of 3, rank 0: gradient of embed.weight: ",
        "largest that step: rank 0: gradient of prefix_layers.0.q_proj.weight: none in the compiled step, one in the eager twin",
    ),
    "tempered_model": (
        "first at step 2 of 3, rank 0: the loss: is ",
        "largest that step: rank 0: gradient of prefix_layers.0.",
    ),
    "gated_model": (
        "first at step 2 of 3, rank 0: the loss: is ",
        "largest that step: rank 0: gradient of prefix_layers.0.",
    ),
    "tanh_gelu_model": (
        "first at step 1 of 3, rank 0: the loss: is ",
        "largest that step: rank 0: gradient of prefix_layers.0.mlp_in.weight",
    ),
    "unscaled_residual_model": (
        "first at step 1 of 3, rank 0: the loss: is ",
        "largest that step: rank 0: gradient of prefix_layers.0.",
    ),
    "detached_cache_model": (
        "first at step 1 of 3, rank 0: gradient of embed.weight: ",
        "largest that step: rank 0: gradient of prefix_layers.0.",
    ),
    # needs depth: the second expert layer reads the first prefix layer's entry (green at one layer a stack)
    "first_entry_model": (
        "first at step 1 of 3, rank 0: the loss: is ",
        "largest that step: rank 0: gradient of expert_layers.1.",
    ),
}
CONTROL = "graph_breaking_model"
CELLS = {MUTANT: [INSIDE, OUTSIDE], UNAPPLIED: [OUTSIDE], SAVING_EVERY_OP: [OUTSIDE], REFERENCE: [INDUCTOR]}
DEEP_ENOUGH = {"first_entry_model": 2}
"""Layers a stack of the variants whose proof needs depth; every other variant's decoder has one (axis
layers_per_stack), where it is caught, or passes, as at two, at about a third of the compile seconds."""
TWIN_CELLS = {variant: [OUTSIDE] for variant in [*TWIN_MUTANTS, CONTROL]}
CHECKPOINTING_TESTS = [GRADIENTS.format(0.0), MICRO_BATCHES]
TESTS = [*CHECKPOINTING_TESTS, EAGER_TWIN]


def depth(variant: str) -> int:
    return DEEP_ENOUGH.get(variant, 1)


def run_id(cell: str, variant: str) -> str:
    return f"{cell}-{variant}-{depth(variant)}"


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory):
    """The one run: every variant in its cells, only TESTS; exit code, {cell id: {test: testcase}}, output, properties."""
    root = tmp_path_factory.mktemp("compiled_variants")
    (root / "grad_ckpt_variants.py").symlink_to(REPO / "tests" / "suites" / "grad_ckpt_variants.py")
    return run_suite(root, compiled_variants_matrix(CELLS, depth), *(f"grad_ckpt::{test}" for test in TESTS))


@pytest.fixture(scope="module")
def twin_run(tmp_path_factory):
    """The eager-twin mutants and the control, each in the aot_eager cell, only the eager-twin test."""
    root = tmp_path_factory.mktemp("eager_twin_variants")
    (root / "grad_ckpt_variants.py").symlink_to(REPO / "tests" / "suites" / "grad_ckpt_variants.py")
    return run_suite(root, compiled_variants_matrix(TWIN_CELLS, depth), f"grad_ckpt::{EAGER_TWIN}")


@pytest.mark.parametrize("planned", ["compiled", "twin"])
def test_each_run_has_every_planned_cell_and_fails(compiled_run, twin_run, planned):
    returncode, cases, output, _ = compiled_run if planned == "compiled" else twin_run
    cells = CELLS if planned == "compiled" else TWIN_CELLS
    assert returncode == 1, output
    assert sorted(cases) == sorted(run_id(cell, variant) for variant, ids in cells.items() for cell in ids), output


def test_compiled_inside_the_recompute_that_switches_graphs_fails_naming_unit_mode_and_cause(compiled_run):
    _, cases, _, _ = compiled_run
    inside = run_id(INSIDE, MUTANT)
    for test in CHECKPOINTING_TESTS:
        case = cases[inside][test]
        assert case.is_failure, f"{test} passed on a recompute that switched graphs"
        assert case.result[0].message.startswith("torch.utils.checkpoint.CheckpointError: "), case.result[0].message
        assert (
            f"cell {inside}, torch 2.13.0+cpu, compile=aot_eager, nesting inside: backward with activation "
            "checkpointing (did a recomputed layer differ from its forward?) failed in the recompute of checkpoint "
            "unit prefix_layers." in failure_text(case)
        ), failure_text(case)


def test_compiled_around_the_block_the_recompute_is_the_traced_graph_and_passes(compiled_run):
    _, cases, _, _ = compiled_run
    outside = cases[run_id(OUTSIDE, MUTANT)]
    assert all(case.is_passed for case in outside.values()), {
        name: failure_text(case) for name, case in outside.items()
    }


def test_compiled_blocks_never_checkpointed_fail_with_the_saved_bytes(compiled_run):
    _, cases, _, _ = compiled_run
    cell = run_id(OUTSIDE, UNAPPLIED)
    for test in CHECKPOINTING_TESTS:
        case = cases[cell][test]
        assert case.is_failure, failure_text(case)
        text = failure_text(case)
        assert f"cell {cell} (compile=aot_eager, nesting outside): ranks [0]: checkpointing was not applied" in text, (
            text
        )
        assert "bytes for backward with checkpointing and" in text, text


def test_a_policy_saving_every_op_fails_naming_the_policy_not_parallelize(compiled_run):
    """Checkpointing applied under a selective-checkpoint policy that saves every op: autograd saves more
    than without it, and the failure sends the user to the policy, not to `activation_checkpointing=True`."""
    _, cases, _, _ = compiled_run
    cell = run_id(OUTSIDE, SAVING_EVERY_OP)
    for test in CHECKPOINTING_TESTS:
        case = cases[cell][test]
        assert case.is_failure, failure_text(case)
        text = failure_text(case)
        assert "ranks [0]: checkpointing was applied but recomputes nothing" in text, text
        assert "its selective-checkpoint policy saves every op" in text, text
        assert "activation_checkpointing=True" not in text, text


def test_inductor_gradients_match_within_the_named_tolerance(compiled_run):
    _, cases, output, properties = compiled_run
    cell = run_id(INDUCTOR, REFERENCE)
    assert sorted(cases[cell]) == sorted(TESTS), output
    assert all(case.is_passed for case in cases[cell].values()), {n: failure_text(c) for n, c in cases[cell].items()}
    prefix = f"grad_ckpt::{GRADIENTS.format(0.0)}::"
    assert properties[cell][prefix + "precision"].startswith(f"float32 compiled by inductor, rtol={REORDER_RTOL} "), (
        properties[cell]
    )
    assert int(properties[cell][prefix + "grad_max_ulp"]) >= 0
    twin = f"grad_ckpt::{EAGER_TWIN}::"
    assert (
        properties[cell][twin + "eager_twin_comparison"]
        == f"eager twin within s x {STEP_RTOL} x max|eager| per tensor at step s"
    )
    assert 0 <= float(properties[cell][twin + "eager_twin_bound_used"]) <= 1, properties[cell]


@pytest.mark.parametrize("mutant", sorted(TWIN_MUTANTS))
def test_a_model_computing_otherwise_once_compiled_fails_its_eager_twin_naming_the_tensor(twin_run, mutant):
    """The comparison with eager names the first tensor that differs, its step and the tensor that differs most."""
    _, cases, _, _ = twin_run
    cell = run_id(OUTSIDE, mutant)
    case = cases[cell][EAGER_TWIN]
    assert case.is_failure, f"{mutant} passed its eager twin"
    text = failure_text(case)
    assert (
        f"cell {cell} (eager twin bit for bit, compile=aot_eager, nesting outside): the compiled steps differ from "
        "their eager twin (compiled first, eager second): " in text
    ), text
    for expected in TWIN_MUTANTS[mutant]:
        assert expected in text, text


def test_a_benign_graph_break_compiled_with_fullgraph_false_stays_green(twin_run):
    _, cases, _, properties = twin_run
    cell = run_id(OUTSIDE, CONTROL)
    assert all(case.is_passed for case in cases[cell].values()), {n: failure_text(c) for n, c in cases[cell].items()}
    assert properties[cell][f"grad_ckpt::{EAGER_TWIN}::eager_twin_max_ulp"] == "0", properties[cell]


def test_the_inductor_cell_records_its_compile_seconds(compiled_run):
    _, _, _, properties = compiled_run
    cell = run_id(INDUCTOR, REFERENCE)
    assert max(compile_seconds(properties[cell]), default=0) > 0, properties[cell]
