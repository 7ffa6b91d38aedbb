"""Peak memory: what one training step of the cell's stack holds at its highest, by kind of tensor.

The cell's `model` from the suite's seed, wrapped by `parallelize` for the cell (activation
checkpointing asked for, as the stack trains), its `optimizer_<optimizer>` and `training_step`;
`warmup_steps` steps, then one under torch's memory profiler (suites/training_runs/step_memory.py). The test records
rank 0's highest total (`step_peak_bytes`) and each kind's highest (`step_peak_bytes/<kind>`:
parameters, optimizer_state, gradients, activations, temporaries, ...). It fails only when the step
cannot run; the upgrade diff compares the figures between torch versions and flags a kind that grew past
`[report] memory_ratio` (torchmatrix/reports/memory_growth.py). Every test of every suite also records
its ranks' resident high-water mark (and on a GPU the allocator's peaks): torchmatrix/ranks/memory_peaks.py.
Pipelined cells skip: their stages train through a schedule, not one model's step.
"""

from __future__ import annotations

import pytest

from torchmatrix.components.pipeline_axis import pipelines
from torchmatrix.testing import PeakMemoryOptions

from .training_runs.step_memory import STEP_PEAK, measured_step

OPTIONS = PeakMemoryOptions  # the dataclass `suite_options` arrives as


def test_training_step_memory(cell, ranks, suite_options, components, record_property):
    """One step's highest memory, in total and by kind, on rank 0."""
    if pipelines(cell):
        pytest.skip("a pipelined cell trains through its schedule's stages, not one model's step: not measured")
    if "optimizer" not in cell:
        pytest.fail(
            "the cell has no optimizer axis: peak_memory trains with [components] optimizer_<value>; "
            'add an axis such as optimizer = ["adamw"]',
            pytrace=False,
        )
    profiled = ranks.run(measured_step, dict(cell), suite_options, dict(components))[0]  # rank 0's (step_memory.py)
    if "unavailable" in profiled:
        pytest.skip(profiled["unavailable"])
    record_property(STEP_PEAK, profiled[STEP_PEAK])
    for kind, size in profiled["kinds"].items():
        record_property(f"{STEP_PEAK}/{kind}", size)
    assert profiled[STEP_PEAK] > 0, f"{cell.id}: the profiled step allocated nothing on its device"
