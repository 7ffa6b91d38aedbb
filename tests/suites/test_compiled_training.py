"""resume and dtensor_optim under torch.compile, on the reference components: one real run over an
aot_eager cell without FSDP and one with FSDP2 at world size 2. A compiled model (its blocks are
``torch.compile`` modules, whose parameter names carry ``_orig_mod.``) resumes bit for bit, and a
compiled FSDP2 model's optimizer state keeps its parameters' layout, is saved sharded and reshards
exactly; both cells record compile seconds, so the model really was compiled. The decoder is one layer a
stack (axis `layers_per_stack`): a compiled block resumes and shards as every other does, and the reference's
eager cells elsewhere prove the product's depth."""

from __future__ import annotations

import pytest

from torchmatrix.models.transformer import DEPTH_AXIS

from helpers.grad_ckpt_runs import compile_seconds, failure_text, run_suite
from helpers.matrix_files import REFERENCE_COMPONENTS, matrix_toml

pytestmark = pytest.mark.slow

CELLS = ["ws1-none-sdpa-adamw-aot_eager-1", "ws2-fsdp2-sdpa-adamw-aot_eager-1"]
LAYOUT = ("test_state_is_laid_out_like_its_param", "test_saved_state_is_sharded", "test_reshard_load_is_exact")


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory):
    axes = ["world_size", "fsdp", "optimizer", "compile", DEPTH_AXIS]
    matrix = matrix_toml(
        torch=["2.13.0"],
        axes={
            "world_size": [1, 2],
            "fsdp": ["none", "fsdp2"],
            "attn": ["sdpa"],
            "optimizer": ["adamw"],
            "compile": ["aot_eager"],
            DEPTH_AXIS: [1],
        },
        exclude=[{"fsdp": "none", "world_size": 2}, {"fsdp": "fsdp2", "world_size": 1}],
        suites={
            "resume": {"path": None, "timeout": 900, "axes": axes, "options": {"steps": 6, "resume_step": 3}},
            "dtensor_optim": {"path": None, "timeout": 900, "axes": axes},
        },
        components={**REFERENCE_COMPONENTS, "batch": "torchmatrix.models.transformer:make_batch"},
    )
    return run_suite(tmp_path_factory.mktemp("training"), matrix)


def test_a_compiled_model_resumes_bit_for_bit_and_keeps_its_state_layout(compiled_run):
    returncode, cases, output, _ = compiled_run
    assert returncode == 0, output
    assert sorted(cases) == CELLS, output
    failed = {
        cell: {name: failure_text(case) for name, case in tests.items() if not (case.is_passed or case.is_skipped)}
        for cell, tests in cases.items()
    }
    assert not any(failed.values()), failed
    resumed = [name for name, case in cases[CELLS[0]].items() if name.startswith("test_") and case.is_passed]
    assert "test_losses_identical_after_resume" in resumed and "test_final_parameters_identical" in resumed
    laid_out = {name.split("[", 1)[0] for name, case in cases[CELLS[1]].items() if case.is_passed}
    assert set(LAYOUT) <= laid_out, sorted(laid_out)


def test_both_cells_compiled(compiled_run):
    _, _, _, properties = compiled_run
    for cell in CELLS:
        assert max(compile_seconds(properties[cell]), default=0) > 0, properties[cell]
