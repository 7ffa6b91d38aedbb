"""The parallel_equivalence suite passes on accumulating cells of the reference stack (FSDP2 under bf16
mixed precision and fp32, FSDP1's no_sync() in fp32) and names each accumulation mutant of
models/mutants/accumulation.py by cause.

One real `python -m torchmatrix run --torch system`, shared by every test here, at world size 2 and two
steps (the least that still reduces across ranks and trains past the first step): each cell once per
value of axis `variant` (tests/suites/accumulation_variants.py), so one rank pool serves them all.
"""

from __future__ import annotations

import re

import pytest

from helpers.checkout import REPO
from helpers.matrix_files import matrix_toml
from helpers.parallel_equivalence_tests import (
    ACCUMULATION,
    DECLARED_DTYPE,
    EVERY_TEST,
    GRADIENTS,
    NORM,
)
from helpers.run_results import cell_properties, run_and_read

pytestmark = pytest.mark.slow

NOT_CAUGHT_HERE = (GRADIENTS, DECLARED_DTYPE, NORM)
"""Tests a wrong accumulated gradient may fail besides the one that names its cause: the gradient, its
grid (bf16 terms summed without a float32 sum land on a narrower grid) and the norm against the
single-process mean's; their messages say that it differs, not why."""

CONTROLS = (
    "ws2-fsdp2-sdpa-adamw-bf16-reference",
    "ws2-fsdp2-sdpa-adamw-fp32-reference",
    "ws2-fsdp1-sdpa-adamw-fp32-reference",
)
"""Sync off then on with the right dtypes: FSDP2 under MixedPrecisionPolicy(bf16, fp32) and the fp32
default (set_requires_gradient_sync), FSDP1 in fp32 (no_sync())."""
CAUSES = {
    "ws2-fsdp2-sdpa-adamw-bf16-param_dtype_accumulation": "micro-batches were accumulated in bfloat16, not float32",
    "ws2-fsdp2-sdpa-adamw-bf16-last_micro_batch": "gradient holds only the last micro-batch's contribution",
    "ws2-fsdp2-sdpa-adamw-fp32-no_sync_no_op": "gradient was reduced after every micro-batch, not once",
}
"""Each mutant's cell and the cause its accumulation failure must name, per gradient."""
LISTED_GRADIENT = re.compile(r"step \d+: [\w.]+: ")
"""A line of the failure's listing: one gradient at one step."""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The one run: the controls and the mutants' cells; per-cell outcomes, failures and JUnit."""
    root = tmp_path_factory.mktemp("accumulation")
    matrix = matrix_toml(
        axes={
            "world_size": [2],
            "fsdp": ["fsdp2", "fsdp1"],
            "attn": ["sdpa"],
            "optimizer": ["adamw"],
            "accumulation": ["bf16", "fp32"],
            "variant": ["reference", "param_dtype_accumulation", "last_micro_batch", "no_sync_no_op"],
        },
        exclude=[
            {"fsdp": "fsdp1", "accumulation": "bf16"},
            {"fsdp": "fsdp1", "variant": ["param_dtype_accumulation", "last_micro_batch", "no_sync_no_op"]},
            {"accumulation": "fp32", "variant": ["param_dtype_accumulation", "last_micro_batch"]},
            {"accumulation": "bf16", "variant": "no_sync_no_op"},
        ],
        suites={"parallel_equivalence": {"path": None, "timeout": 300, "options": {"steps": 2}}},
        components={
            "model": "torchmatrix.models.transformer:build_model",
            "batch": "torchmatrix.models.transformer:make_batch",
            "parallelize": "accumulation_variants:parallelize",
            "no_sync": "accumulation_variants:no_sync",
            "optimizer_adamw": "torchmatrix.models.optim:build_adamw",
        },
    )
    return run_and_read(root, matrix, components_from=REPO / "tests" / "suites")


@pytest.mark.parametrize("cell", CONTROLS)
def test_sync_off_then_on_matches_the_concatenated_batch_bit_for_bit(run, cell):
    """Every control passes every test, its gradient bit for bit with the concatenated batch's: the same
    additions in the same order on both sides (each rank's micro-batches in float32, then two shards)."""
    done, outcomes, failures, junit = run
    assert outcomes[cell] == dict.fromkeys(EVERY_TEST, "passed"), (
        f"{outcomes[cell]}\n{failures.get(cell)}\n{done.stdout}"
    )
    recorded = cell_properties(junit, cell)
    assert recorded["grad_max_ulp"] == "0" and recorded["loss_max_ulp"] == "0", recorded


@pytest.mark.parametrize("cell", list(CAUSES))
def test_suite_names_each_accumulation_mutant_by_cause(run, cell):
    """The accumulation test fails and names the cause on every gradient it lists; the loss, clipping and
    parameter step still pass (the reference steps with the cell's gradient), so nothing else is blamed."""
    _, outcomes, failures, _ = run
    tests = outcomes[cell]
    assert tests[ACCUMULATION] == "failure", f"{cell}: {tests}"
    listed = [line for line in failures[cell][ACCUMULATION].splitlines() if LISTED_GRADIENT.search(line)]
    assert listed and all(CAUSES[cell] in line for line in listed), failures[cell][ACCUMULATION]
    others = {test: result for test, result in tests.items() if test != ACCUMULATION and test not in NOT_CAUGHT_HERE}
    assert set(others.values()) == {"passed"}, f"{cell}: {others}\n{failures[cell]}"
