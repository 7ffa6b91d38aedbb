"""In a compiled cell no Python body runs again in backward, so the grad-ckpt suite shows that
checkpointing was applied by what autograd saved: with a parallelize that compiles the blocks
without ever switching checkpointing on (models/mutants/compiled_recompute.py), both steps save the
same, and the gradient test fails saying checkpointing was not applied, with the saved bytes; the
reference parallelize passes the same cell in tests/suites/test_grad_ckpt_compile.py."""

from __future__ import annotations

import pytest

from helpers.grad_ckpt_runs import GRADIENTS, REFERENCE, compiled_matrix, failure_text, run_suite

pytestmark = pytest.mark.slow

PARALLELIZE = "torchmatrix.models.mutants.compiled_recompute:checkpoint_dropping_parallelize"
CELL = "ws1-none-sdpa-aot_eager-outside"


@pytest.fixture(scope="module")
def unapplied_run(tmp_path_factory):
    matrix = compiled_matrix(REFERENCE, [CELL]).replace("torchmatrix.models.parallel:parallelize", PARALLELIZE)
    return run_suite(tmp_path_factory.mktemp("unapplied"), matrix, f"grad_ckpt::{GRADIENTS.format(0.0)}")


def test_compiled_blocks_never_checkpointed_fail_with_the_saved_bytes(unapplied_run):
    returncode, cases, output, _ = unapplied_run
    assert returncode == 1, output
    case = cases[CELL][GRADIENTS.format(0.0)]
    assert case.is_failure, failure_text(case)
    text = failure_text(case)
    assert f"cell {CELL} (compile=aot_eager, nesting outside): ranks [0]: checkpointing was not applied" in text, text
    assert "bytes for backward with checkpointing and" in text, text
