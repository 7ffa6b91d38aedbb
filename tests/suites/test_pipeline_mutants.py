"""The parallel_equivalence suite passes on pipelined cells of the reference stack (GPipe, 1F1B and
interleaved 1F1B at pp=2) and on a valid schedule of another shape, and names each pipeline mutant of
models/mutants/pipeline.py by cause and stage.

One real `python -m torchmatrix run --torch system`, shared by every test here, at world size 2 (pp=2, no
data parallelism) and two steps, each cell once per value of axis `variant`
(tests/suites/pipeline_variants.py), so one rank pool serves them all; the controls are as deep as the
product builds them, the mutants one layer a stack.
"""

from __future__ import annotations

import re

import pytest

from helpers.checkout import REPO
from helpers.matrix_files import matrix_toml
from helpers.parallel_equivalence_tests import ACCUMULATION, EVERY_TEST, GRADIENTS, LOSSES, NORM
from helpers.run_results import cell_properties, run_and_read

pytestmark = pytest.mark.slow

CONTROLS = (
    "ws2-none-sdpa-adamw-gpipe-reference",
    "ws2-none-sdpa-adamw-1f1b-reference",
    "ws2-none-sdpa-adamw-interleaved_1f1b-reference",
    "ws2-none-sdpa-adamw-1f1b-scale_grads_off",
)
"""Each schedule at its default (scale_grads=True on each micro-batch's mean loss), and scale_grads=False on
a loss divided by the micro-batch count before the backward."""
CAUSES = {
    "ws2-none-sdpa-adamw-gpipe-double_average": "gradient is 1/2 of the global batch's mean",
    "ws2-none-sdpa-adamw-1f1b-normalised_after_backward": "gradient is the sum of the 2 micro-batches' gradients",
    "ws2-none-sdpa-adamw-gpipe-reinitialised_stage": "gradient holds only micro-batch 1's contribution",
}
"""Each mutant's cell and the cause its failure must name, per gradient."""
ALSO_FAILED = {
    "ws2-none-sdpa-adamw-gpipe-double_average": (GRADIENTS, NORM, LOSSES),
    "ws2-none-sdpa-adamw-1f1b-normalised_after_backward": (GRADIENTS, NORM),
    "ws2-none-sdpa-adamw-gpipe-reinitialised_stage": (GRADIENTS, NORM),
}
"""Tests a mutant fails besides the one that names its cause: the gradient and its norm against the single-process
mean's say that they differ, not why; a loss divided before the schedule's backward is reported divided too."""
LISTED_GRADIENT = re.compile(r"step \d+: [\w.]+ \(stage (\d)\): ")
"""A line of the failure's listing: one gradient, its stage, at one step."""
VARIANTS = (
    "reference",
    "scale_grads_off",
    "double_average",
    "normalised_after_backward",
    "reinitialised_stage",
    "moved_api",
)
MOVED_API = "ws2-none-sdpa-adamw-gpipe-moved_api"
"""A stack that calls PipelineStage._configure_outputs_meta, which 2.13 removed."""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The one run: the controls and the mutants' cells; per-cell outcomes, failures and JUnit."""
    root = tmp_path_factory.mktemp("pipeline")
    matrix = matrix_toml(
        axes={
            "world_size": [2],
            "fsdp": ["none"],
            "attn": ["sdpa"],
            "optimizer": ["adamw"],
            "pipeline": ["gpipe", "1f1b", "interleaved_1f1b"],
            "variant": list(VARIANTS),
        },
        exclude=[
            {"pipeline": "interleaved_1f1b", "variant": [v for v in VARIANTS if v != "reference"]},
            {"pipeline": "gpipe", "variant": ["scale_grads_off", "normalised_after_backward"]},
            {"pipeline": "1f1b", "variant": ["double_average", "reinitialised_stage", "moved_api"]},
        ],
        suites={"parallel_equivalence": {"path": None, "timeout": 300, "options": {"steps": 2}}},
        components={
            "model": "pipeline_variants:build_model",
            "batch": "torchmatrix.models.transformer:make_batch",
            "parallelize": "torchmatrix.models.parallel:parallelize",
            "pipeline_schedule": "pipeline_variants:pipeline_schedule",
            "optimizer_adamw": "torchmatrix.models.optim:build_adamw",
        },
    )
    return run_and_read(root, matrix, components_from=REPO / "tests" / "suites")


@pytest.mark.parametrize("cell", CONTROLS)
def test_pipelined_step_matches_the_single_process_step_bit_for_bit(run, cell):
    """Every control passes every test, loss and gradient bit for bit with the whole model's on the same
    micro-batches: the stages run the same operations, and dividing by two micro-batches is exact wherever it happens."""
    done, outcomes, failures, junit = run
    assert outcomes[cell] == dict.fromkeys(EVERY_TEST, "passed"), (
        f"{outcomes[cell]}\n{failures.get(cell)}\n{done.stdout}"
    )
    recorded = cell_properties(junit, cell)
    assert recorded["grad_max_ulp"] == "0" and recorded["loss_max_ulp"] == "0", recorded


@pytest.mark.parametrize("cell", list(CAUSES))
def test_suite_names_each_pipeline_mutant_by_cause_and_stage(run, cell):
    """The micro-batch test fails and names the cause, and the stage, on every gradient it lists, both stages
    among them; the clipping and parameter step still pass (the reference steps only on a gradient it vouches for)."""
    _, outcomes, failures, _ = run
    tests = outcomes[cell]
    assert tests[ACCUMULATION] == "failure", f"{cell}: {tests}"
    listed = [line for line in failures[cell][ACCUMULATION].splitlines() if LISTED_GRADIENT.search(line)]
    assert listed and all(CAUSES[cell] in line for line in listed), failures[cell][ACCUMULATION]
    assert {LISTED_GRADIENT.search(line).group(1) for line in listed} == {"0", "1"}, failures[cell][ACCUMULATION]
    others = {test: result for test, result in tests.items() if test != ACCUMULATION and test not in ALSO_FAILED[cell]}
    assert set(others.values()) <= {"passed", "skipped"}, f"{cell}: {others}\n{failures[cell]}"


def test_a_moved_pipelining_api_fails_the_cell_naming_it(run):
    """A stack calling a pipelining API the release removed errors each test of its cell with one root cause
    naming the API and the release, and the run goes on to its other cells."""
    done, outcomes, _, junit = run
    assert set(outcomes[MOVED_API].values()) == {"error"}, outcomes[MOVED_API]
    suite = next(suite for suite in junit if MOVED_API in suite.name)
    messages = {case.result[0].message for case in suite}
    assert len(messages) == 1, messages
    (message,) = messages
    assert "PipeliningApiMoved: torch " in message and "PipelineStage has no _configure_outputs_meta" in message, (
        message
    )
