"""Components for one run of the parallel_equivalence suite over pipelined cells of the reference stack and
its pipeline mutants side by side: axis `variant` picks, per cell, the reference schedule, a valid schedule
of another shape, or a mutant of models/mutants/pipeline.py, so one rank pool serves them all."""

from __future__ import annotations

from torchmatrix.models import transformer
from torchmatrix.models.mutants import pipeline as mutants
from torchmatrix.suites.references import pipelining


def schedule_dividing_its_loss_without_scaling(stages, *, n_microbatches, loss_fn, cell):
    """A valid schedule of another shape: the loss divided by the micro-batch count before the schedule's
    backward, `scale_grads=False` to match (what PyTorch's docs ask of a loss that is not each micro-batch's mean)."""

    def rescaled(output, target):
        return loss_fn(output, target) / n_microbatches

    return pipelining.build_schedule(
        stages, n_microbatches=n_microbatches, loss_fn=rescaled, cell=cell, scale_grads=False
    )


def schedule_configuring_outputs_meta(stages, *, n_microbatches, loss_fn, cell):
    """A stack written for a release before 2.13: it sets the stage's output metadata through the private
    `PipelineStage._configure_outputs_meta`, which 2.13 removed."""
    for stage in stages:
        stage._configure_outputs_meta(())
    return pipelining.build_schedule(stages, n_microbatches=n_microbatches, loss_fn=loss_fn, cell=cell)


SCHEDULES = {
    "reference": pipelining.build_schedule,
    "scale_grads_off": schedule_dividing_its_loss_without_scaling,
    "double_average": mutants.schedule_dividing_the_loss_by_the_micro_batches,
    "normalised_after_backward": mutants.schedule_normalising_the_loss_after_its_backward,
    "reinitialised_stage": mutants.schedule_reinitialising_each_stage,
    "moved_api": schedule_configuring_outputs_meta,
}


def pipeline_schedule(stages, *, n_microbatches, loss_fn, cell):
    """The schedule axis `variant` names."""
    return SCHEDULES[cell["variant"]](stages, n_microbatches=n_microbatches, loss_fn=loss_fn, cell=cell)


CONTROLS = ("reference", "scale_grads_off")


def build_model(cell, **keywords):
    """The reference decoder as deep as the product builds a pipelined cell's for the controls; one layer a
    stack, one a stage, for the mutants, whose proofs need no depth."""
    if cell["variant"] in CONTROLS:
        return transformer.build_model(cell, **keywords)
    return transformer.build_model({**cell, transformer.DEPTH_AXIS: 1}, **keywords)
