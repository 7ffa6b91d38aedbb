"""The grad-ckpt suite under compile fails on a block whose compiled recompute is not the graph its
forward ran (models/mutants/compiled_recompute.py): compiled inside the checkpointed region, the
recompute fails a guard and runs another graph, and the failure names the checkpoint unit, the
compile mode and torch's CheckpointError; compiled around the checkpointed block, recompute runs in
the graph the forward traced, so the same block is consistent and passes. The reference components
pass these cells in tests/suites/test_grad_ckpt_compile.py."""

from __future__ import annotations

import pytest

from helpers.grad_ckpt_runs import GRADIENTS, MICRO_BATCHES, compiled_matrix, failure_text, run_suite

pytestmark = pytest.mark.slow

MUTANT = "torchmatrix.models.mutants.compiled_recompute:recompute_switching_model"
INSIDE, OUTSIDE = "ws1-none-sdpa-aot_eager-inside", "ws1-none-sdpa-aot_eager-outside"
TESTS = [GRADIENTS.format(0.0), MICRO_BATCHES]


@pytest.fixture(scope="module")
def mutant_run(tmp_path_factory):
    return run_suite(
        tmp_path_factory.mktemp("mutant"),
        compiled_matrix(MUTANT, [INSIDE, OUTSIDE]),
        *(f"grad_ckpt::{t}" for t in TESTS),
    )


def test_compiled_inside_the_recompute_that_switches_graphs_fails_naming_unit_mode_and_cause(mutant_run):
    returncode, cases, output, _ = mutant_run
    assert returncode == 1, output
    for test in TESTS:
        case = cases[INSIDE][test]
        assert case.is_failure, f"{test} passed on a recompute that switched graphs"
        assert case.result[0].message.startswith("torch.utils.checkpoint.CheckpointError: "), case.result[0].message
        assert (
            f"cell {INSIDE}, torch 2.13.0+cpu, compile=aot_eager, nesting inside: backward with activation "
            "checkpointing (did a recomputed layer differ from its forward?) failed in the recompute of checkpoint "
            "unit prefix_layers." in failure_text(case)
        ), failure_text(case)


def test_compiled_around_the_block_the_recompute_is_the_traced_graph_and_passes(mutant_run):
    _, cases, _, _ = mutant_run
    assert all(case.is_passed for case in cases[OUTSIDE].values()), {
        name: failure_text(case) for name, case in cases[OUTSIDE].items()
    }
