"""The grad-ckpt suite's one inductor cell in CI (inductor on CPU compiles C++ for tens of seconds per
graph): the reference components pass the gradient comparisons, single step and micro-batches, within
the derived float32 reordering tolerance that the precision property names, with the ULP distance
and the compile seconds recorded."""

from __future__ import annotations

import pytest

from suites.test_grad_ckpt import REORDER_RTOL

from helpers.grad_ckpt_runs import (
    GRADIENTS,
    MICRO_BATCHES,
    REFERENCE,
    compile_seconds,
    compiled_matrix,
    failure_text,
    run_suite,
)

pytestmark = pytest.mark.slow

CELL = "ws1-none-sdpa-inductor-outside"
TESTS = [GRADIENTS.format(0.0), MICRO_BATCHES]


@pytest.fixture(scope="module")
def inductor_run(tmp_path_factory):
    return run_suite(
        tmp_path_factory.mktemp("inductor"),
        compiled_matrix(REFERENCE, [CELL]),
        *(f"grad_ckpt::{test}" for test in TESTS),
    )


def test_the_gradients_match_within_the_named_tolerance(inductor_run):
    returncode, cases, output, properties = inductor_run
    assert returncode == 0, output
    assert sorted(cases[CELL]) == sorted(TESTS), output
    assert all(case.is_passed for case in cases[CELL].values()), {n: failure_text(c) for n, c in cases[CELL].items()}
    prefix = f"grad_ckpt::{GRADIENTS.format(0.0)}::"
    assert properties[CELL][prefix + "precision"].startswith(f"float32 compiled by inductor, rtol={REORDER_RTOL} "), (
        properties[CELL]
    )
    assert int(properties[CELL][prefix + "grad_max_ulp"]) >= 0


def test_the_cell_records_its_compile_seconds(inductor_run):
    _, _, _, properties = inductor_run
    assert max(compile_seconds(properties[CELL]), default=0) > 0, properties[CELL]
