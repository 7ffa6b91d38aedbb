"""Known-bad `pipeline_schedule` components: each makes a pipelined step's gradient another than the global
batch's mean, in the way a real stack did; suites/test_parallel_equivalence.py must name each by cause.

Point `[components] pipeline_schedule` at one of these to see it caught.
"""

from __future__ import annotations

from torchmatrix.suites.references.pipelining import build_schedule


def schedule_dividing_the_loss_by_the_micro_batches(stages, *, n_microbatches, loss_fn, cell):
    """The cell's schedule fed a loss already divided by the micro-batch count, as a gradient-accumulation
    loop rescales it, while the schedule's `scale_grads=True` default divides the gradients by that count
    again: the gradient is 1/n_microbatches of the mean (torchtitan#1733; the default since pytorch PR #144352)."""

    def rescaled(output, target):
        return loss_fn(output, target) / n_microbatches

    return build_schedule(stages, n_microbatches=n_microbatches, loss_fn=rescaled, cell=cell)


class LossNormalisedAfterBackward:
    """A schedule whose trainer turns `scale_grads` off to normalise the loss itself, but divides the micro-batch
    losses by their count only after `step`, whose backward already ran on the undivided ones: the reported
    loss is the mean, the gradient the micro-batches' sum (torchtitan#2972)."""

    scale_grads = False

    def __init__(self, schedule, n_microbatches: int):
        self.schedule = schedule
        self.n_microbatches = n_microbatches

    def step(self, *inputs, losses=None, **keywords):
        result = self.schedule.step(*inputs, losses=losses, **keywords)
        if losses is not None:
            losses[:] = [loss / self.n_microbatches for loss in losses]
        return result


def schedule_normalising_the_loss_after_its_backward(stages, *, n_microbatches, loss_fn, cell):
    """The cell's schedule with `scale_grads=False` and the loss normalised after its internal backward."""
    schedule = build_schedule(stages, n_microbatches=n_microbatches, loss_fn=loss_fn, cell=cell, scale_grads=False)
    return LossNormalisedAfterBackward(schedule, n_microbatches)


def schedule_reinitialising_each_stage(stages, *, n_microbatches, loss_fn, cell):
    """The cell's schedule over stages that are re-initialised before each micro-batch's backward, their
    parameters' gradients set to None, so only the last micro-batch's gradient survives to the step, divided
    by the micro-batch count (NeMo Automodel PR #3530)."""
    for stage in stages:
        stage.backward_one_chunk = wiping_before_backward(stage, stage.backward_one_chunk)
    return build_schedule(stages, n_microbatches=n_microbatches, loss_fn=loss_fn, cell=cell)


def wiping_before_backward(stage, backward_one_chunk):
    """`stage.backward_one_chunk` after setting the gradients of the stage's module to None."""

    def wiped_then_backward(*arguments, **keywords):
        stage.submod.zero_grad(set_to_none=True)
        return backward_one_chunk(*arguments, **keywords)

    return wiped_then_backward
