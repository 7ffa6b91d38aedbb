"""The grad-ckpt suite under torch.compile, on the reference components: one real run over
aot_eager cells (outside and inside at world size 1, outside under FSDP2 at world size 2), every
test passing bit for bit, each cell's compile seconds recorded apart from its test time; and a cell
naming a backend torch does not have, where every test fails with the compile mode and torch's own
root cause, not a lost cell. The inductor cell is tests/suites/test_grad_ckpt_inductor.py's, the
known-bad block tests/suites/test_grad_ckpt_compile_mutants.py's.
"""

from __future__ import annotations

import pytest
from junitparser import JUnitXml
from test_grad_ckpt_mutants import EVERY_TEST, GRADIENTS, failure_text

from conftest import Project, matrix_toml

pytestmark = pytest.mark.slow

REFERENCE = "torchmatrix.models.transformer:build_model"
CELLS = ["ws1-none-sdpa-aot_eager-outside", "ws1-none-sdpa-aot_eager-inside", "ws2-fsdp2-sdpa-aot_eager-outside"]
NO_SUCH_BACKEND = "ws1-none-sdpa-no_such_backend-outside"


def compiled_matrix(model: str, cells: list[str]) -> str:
    """grad_ckpt on exactly ``cells`` (ids ws<N>-<fsdp>-sdpa-<backend>-<nesting>), as includes of an empty product."""
    include = []
    for cell in cells:
        world_size, fsdp, attn, backend, nesting = cell.split("-")
        include.append(
            {
                "world_size": int(world_size.removeprefix("ws")),
                "fsdp": fsdp,
                "attn": attn,
                "compile": backend,
                "compile_nesting": nesting,
            }
        )
    matrix = matrix_toml(
        torch=["2.13.0"],
        axes={
            "world_size": [1],
            "fsdp": ["none"],
            "attn": ["sdpa"],
            "compile": ["none"],
            "compile_nesting": ["outside"],
        },
        exclude=[{"compile": "none"}],
        suites={
            "grad_ckpt": {
                "path": None,
                "timeout": 1200,
                "axes": ["world_size", "fsdp", "attn", "compile", "compile_nesting"],
            }
        },
        components={
            "model": model,
            "parallelize": "torchmatrix.models.parallel:parallelize",
            "batch": "torchmatrix.models.transformer:make_batch",
        },
    )
    return matrix + "".join(include_table(entry) for entry in include)


def include_table(entry: dict) -> str:
    values = "\n".join(f"{key} = {value!r}".replace("'", '"') for key, value in entry.items())
    return f"\n\n[[include]]\n{values}\n"


def run_compiled(root, matrix: str, *tests: str):
    """Exit code, {cell id: {test name: testcase}}, the CLI output and {cell id: {property: value}} of
    one run of ``matrix`` (only ``tests``, as SUITE::TEST, where given)."""
    project = Project(root)
    project.write("matrix.toml", matrix)
    selected = [argument for test in tests for argument in ("--test", test)]
    done = project.torchmatrix(
        "run", "--torch", "system", "--reports", "out", "--confirm-limit", "0", *selected, timeout=1800
    )
    cases: dict[str, dict[str, object]] = {}
    properties: dict[str, dict[str, str]] = {}
    for suite in JUnitXml.fromfile(str(root / "out" / "latest" / "junit.xml")):
        cell = suite.name.split("/", 1)[1]
        cases[cell] = {case.name.split("[torch=", 1)[0]: case for case in suite}
        properties[cell] = {prop.name: prop.value for prop in suite.properties()}
    return done.returncode, cases, done.stdout + done.stderr, properties


def compile_seconds(found: dict[str, str]) -> list[float]:
    """The compile seconds each test of a cell recorded."""
    return [float(value) for name, value in found.items() if name.endswith("::compile_seconds")]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    return run_compiled(tmp_path_factory.mktemp("compiled"), compiled_matrix(REFERENCE, [*CELLS, NO_SUCH_BACKEND]))


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
