"""The grad-ckpt suite under torch.compile, on the reference components: one real run over
aot_eager cells (outside and inside at world size 1, outside under FSDP2 at world size 2), every
test passing bit for bit (the compiled steps against their eager twin too), each cell's compile seconds recorded apart from its test time; and a cell
naming a backend torch does not have, where every test fails with the compile mode and torch's own
root cause, not a lost cell. The inductor cell, the known-bad block and the parallelize that never
checkpoints are tests/suites/test_grad_ckpt_compile_mutants.py's.

The default matrix's compiled cell (ws1, outside) builds the decoder as deep as the product does, two
layers a stack (the depth first_entry_model needs, green here); the cells beyond it one, which compiles
a third as long (axis `layers_per_stack`).
"""

from __future__ import annotations

import pytest

from torchmatrix.models.transformer import SHALLOW_LAYERS_PER_STACK

from helpers.grad_ckpt_runs import (
    EAGER_TWIN,
    EVERY_TEST,
    GRADIENTS,
    REFERENCE,
    compile_seconds,
    compiled_matrix,
    failure_text,
    run_suite,
)

pytestmark = pytest.mark.slow

DEFAULT_MATRIX_CELL = "ws1-none-sdpa-aot_eager-outside"
PLANNED = [DEFAULT_MATRIX_CELL, "ws1-none-sdpa-aot_eager-inside", "ws2-fsdp2-sdpa-aot_eager-outside"]
NO_BACKEND_PLANNED = "ws1-none-sdpa-no_such_backend-outside"


def depth(cell: str) -> int:
    return SHALLOW_LAYERS_PER_STACK if cell == DEFAULT_MATRIX_CELL else 1


def run_id(cell: str) -> str:
    return f"{cell}-{depth(cell)}"


CELLS = [run_id(cell) for cell in PLANNED]
NO_SUCH_BACKEND = run_id(NO_BACKEND_PLANNED)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    matrix = compiled_matrix(REFERENCE, [*PLANNED, NO_BACKEND_PLANNED], depth)
    return run_suite(tmp_path_factory.mktemp("compiled"), matrix)


def test_every_test_passes_bit_for_bit_in_every_aot_eager_cell(reference_run):
    returncode, cases, output, properties = reference_run
    assert returncode == 1, output  # the cell with no such backend
    assert sorted(cases) == sorted([*CELLS, NO_SUCH_BACKEND]), output
    for cell in CELLS:
        assert sorted(cases[cell]) == EVERY_TEST, cell
        assert all(case.is_passed for case in cases[cell].values()), {
            cell: {name: failure_text(case) for name, case in cases[cell].items()}
        }
        for dropout in (0.0, 0.1):
            prefix = f"grad_ckpt::{GRADIENTS.format(dropout)}::"
            assert properties[cell][prefix + "precision"] == "float32, bit for bit", cell
            assert properties[cell][prefix + "grad_max_ulp"] == "0", cell
        twin = f"grad_ckpt::{EAGER_TWIN}::"
        assert properties[cell][twin + "eager_twin_comparison"] == "eager twin bit for bit", cell
        assert properties[cell][twin + "eager_twin_max_ulp"] == "0", cell


def test_each_compiled_cell_records_its_compile_seconds(reference_run):
    _, _, _, properties = reference_run
    for cell in CELLS:
        assert max(compile_seconds(properties[cell]), default=0) > 0, properties[cell]


def test_a_compiler_error_fails_every_test_with_the_compile_mode_and_torchs_root_cause(reference_run):
    _, cases, _, _ = reference_run
    assert sorted(cases[NO_SUCH_BACKEND]) == EVERY_TEST
    for name, case in cases[NO_SUCH_BACKEND].items():
        assert not case.is_passed and not case.is_skipped, name
        assert case.result[0].message.startswith(
            "torch._dynamo.exc.InvalidBackend: Invalid backend: 'no_such_backend'"
        ), case.result[0].message
    first = cases[NO_SUCH_BACKEND][GRADIENTS.format(0.0)]
    assert (
        f"cell {NO_SUCH_BACKEND}, torch 2.13.0+cpu, compile=no_such_backend, nesting outside: parallelize (fsdp=none, mesh=flat) "
        "with activation checkpointing failed: torch._dynamo.exc.InvalidBackend" in failure_text(first)
    ), failure_text(first)
