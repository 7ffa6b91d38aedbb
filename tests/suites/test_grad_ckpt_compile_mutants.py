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
- the one inductor cell in CI (inductor on CPU compiles C++ for tens of seconds per graph): the reference
  components pass within the derived float32 reordering tolerance that the precision property names,
  with the ULP distance and the compile seconds recorded.

The reference components pass the aot_eager cells in tests/suites/test_grad_ckpt_compile.py.
"""

from __future__ import annotations

import pytest

from suites.test_grad_ckpt import REORDER_RTOL

from helpers.checkout import REPO
from helpers.grad_ckpt_runs import (
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
CELLS = {MUTANT: [INSIDE, OUTSIDE], UNAPPLIED: [OUTSIDE], SAVING_EVERY_OP: [OUTSIDE], REFERENCE: [INDUCTOR]}
TESTS = [GRADIENTS.format(0.0), MICRO_BATCHES]


def run_id(cell: str, variant: str) -> str:
    return f"{cell}-{variant}"


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory):
    """The one run: every variant in its cells, only TESTS; exit code, {cell id: {test: testcase}}, output, properties."""
    root = tmp_path_factory.mktemp("compiled_variants")
    (root / "grad_ckpt_variants.py").symlink_to(REPO / "tests" / "suites" / "grad_ckpt_variants.py")
    return run_suite(root, compiled_variants_matrix(CELLS), *(f"grad_ckpt::{test}" for test in TESTS))


def test_the_run_has_every_planned_cell_and_fails(compiled_run):
    returncode, cases, output, _ = compiled_run
    assert returncode == 1, output
    assert sorted(cases) == sorted(run_id(cell, variant) for variant, ids in CELLS.items() for cell in ids), output


def test_compiled_inside_the_recompute_that_switches_graphs_fails_naming_unit_mode_and_cause(compiled_run):
    _, cases, _, _ = compiled_run
    inside = run_id(INSIDE, MUTANT)
    for test in TESTS:
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
    for test in TESTS:
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
    for test in TESTS:
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


def test_the_inductor_cell_records_its_compile_seconds(compiled_run):
    _, _, _, properties = compiled_run
    cell = run_id(INDUCTOR, REFERENCE)
    assert max(compile_seconds(properties[cell]), default=0) > 0, properties[cell]
