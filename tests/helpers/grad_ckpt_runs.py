"""The grad_ckpt suite's test names and one run of it over a matrix, read back from its JUnit:
what the grad_ckpt tests, eager and compiled, share."""

from __future__ import annotations

from collections.abc import Callable

from junitparser import JUnitXml

from torchmatrix.models.transformer import DEPTH_AXIS

from helpers.matrix_files import include_table, matrix_toml
from helpers.projects import Project

REFERENCE = "torchmatrix.models.transformer:build_model"
PARALLELIZE = "torchmatrix.models.parallel:parallelize"
GRADIENTS = "test_checkpointing_leaves_loss_and_gradients_unchanged[dropout={}]"
RECOMPUTE = "test_recompute_reruns_layers_and_rewrites_cache_identically"
BUFFERS = "test_checkpointing_leaves_every_buffer_unchanged"
ATTRIBUTES = "test_checkpointing_leaves_module_attributes_unchanged"
MICRO_BATCHES = "test_micro_batches_before_one_backward_leave_gradients_unchanged"
EAGER_TWIN = "test_compiled_steps_match_their_eager_twin"
ANOTHER_LENGTH = "test_forward_at_another_length_leaves_gradients_unchanged"
EVERY_TEST = sorted(
    [
        GRADIENTS.format(0.0),
        GRADIENTS.format(0.1),
        RECOMPUTE,
        BUFFERS,
        ATTRIBUTES,
        MICRO_BATCHES,
        EAGER_TWIN,
        ANOTHER_LENGTH,
    ]
)
NO_COMPILED_STEP = 'an eager cell (compile = "none"): no compiled step to compare with eager'
COMPILED_ONLY = {
    EAGER_TWIN: NO_COMPILED_STEP,
    ANOTHER_LENGTH: "an eager cell keeps no graph per sequence length",
}
"""The tests an eager cell skips, and what the skip must say."""


def passed_in_an_eager_cell(tests: dict[str, object]) -> dict[str, str]:
    """The tests of an eager cell that did not pass, with their text: every test must pass there,
    except the compiled cells' own tests, which must skip saying why."""
    wrong = {
        name: "did not skip"
        for name, reason in COMPILED_ONLY.items()
        if not (name in tests and tests[name].is_skipped and reason in failure_text(tests[name]))
    }
    return wrong | {
        name: failure_text(case) for name, case in tests.items() if name not in COMPILED_ONLY and not case.is_passed
    }


def run_suite(
    root, matrix: str, *tests: str
) -> tuple[int, dict[str, dict[str, object]], str, dict[str, dict[str, str]]]:
    """Exit code, {cell id: {test name: testcase}}, the CLI output and {cell id: {property: value}} of
    one run of ``matrix`` (only ``tests``, as SUITE::TEST, where given)."""
    project = Project(root)
    project.write("matrix.toml", matrix)
    selected = [argument for test in tests for argument in ("--test", test)]
    # Mutants fail for a known reason; re-running each failure alone would only double the time.
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


def failure_text(case) -> str:
    """Every result's message and text of a JUnit testcase, one after the other."""
    return "\n".join(f"{result.message or ''}\n{result.text or ''}" for result in case.result)


COMPILED_AXES = ["world_size", "fsdp", "attn", "compile", "compile_nesting"]


def compiled_matrix(model: str, cells: list[str], depth: Callable[[str], int]) -> str:
    """grad_ckpt on exactly ``cells`` (ids ws<N>-<fsdp>-sdpa-<backend>-<nesting>), each run as id ...-<depth>,
    its decoder `depth(cell)` layers a stack deep, as includes of an empty product."""
    values = [[*cell.split("-"), depth(cell)] for cell in cells]
    return compiled_includes_matrix([*COMPILED_AXES, DEPTH_AXIS], values, model, PARALLELIZE)


def compiled_variants_matrix(cells: dict[str, list[str]], depth: Callable[[str], int]) -> str:
    """grad_ckpt on exactly these cells with tests/suites/grad_ckpt_variants.py's components: variant ->
    its cell ids ws<N>-<fsdp>-sdpa-<backend>-<nesting>, each run as id ...-<nesting>-<variant>-<depth>, its
    decoder `depth(variant)` layers a stack deep (the reference decoder's axis layers_per_stack)."""
    values = [[*cell.split("-"), variant, depth(variant)] for variant, ids in cells.items() for cell in ids]
    return compiled_includes_matrix(
        [*COMPILED_AXES, "variant", DEPTH_AXIS],
        values,
        "grad_ckpt_variants:build_model",
        "grad_ckpt_variants:parallelize",
    )


def compiled_includes_matrix(axes: list[str], cells: list[list[object]], model: str, parallelize: str) -> str:
    """grad_ckpt over axes `axes` on exactly `cells` (each one value per axis), as includes of an empty product."""
    empty = {"world_size": [1], "fsdp": ["none"], "attn": ["sdpa"], "compile": ["none"], "compile_nesting": ["outside"]}
    empty.update({axis: [values[axes.index(axis)] for values in cells][:1] for axis in axes if axis not in empty})
    matrix = matrix_toml(
        torch=["2.13.0"],
        axes=empty,
        exclude=[{"compile": "none"}],
        suites={"grad_ckpt": {"path": None, "timeout": 1200, "axes": axes}},
        components={"model": model, "parallelize": parallelize, "batch": "torchmatrix.models.transformer:make_batch"},
    )
    entries = [dict(zip(axes, values)) for values in cells]
    for entry in entries:
        entry["world_size"] = int(entry["world_size"].removeprefix("ws"))
    return matrix + "".join(include_table(entry) for entry in entries)


def compile_seconds(found: dict[str, str]) -> list[float]:
    """The compile seconds each test of a cell recorded."""
    return [float(value) for name, value in found.items() if name.endswith("::compile_seconds")]
