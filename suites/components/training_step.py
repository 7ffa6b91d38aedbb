"""The `training_step` component: the stack's own loss, backward and optimizer step, run as its
trainer runs them (a loss function applied to the model's output, `fabric.backward(loss)`, a grad
scaler's `step` and `update`), or the suites' plain ones where matrix.toml names none or the
stack's object leaves one out.

One component with three members, not three components: what they need is built once per
training run and shared between them (the Fabric that set up the model, a scaler whose scale
carries from backward to the optimizer step), as the bound checkpointer is built once.
"""

from __future__ import annotations

import torch

from torchmatrix.testing import call_accepting, load

from .model_output import call_model, loss_of

MEMBERS = ("loss", "backward", "optimizer_step")


class PlainStep:
    """The step as the suites take it without a component: the model called with the batch, the
    loss read from its output, `loss.backward()`, `optimizer.step()`."""

    def __init__(self, *, model, optimizer):
        self.model = model
        self.optimizer = optimizer

    def loss(self, batch) -> torch.Tensor:
        return loss_of(call_model(self.model, batch))

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def optimizer_step(self) -> None:
        self.optimizer.step()


class TrainingStep:
    """The three calls of one training step: each the stack's own where its object defines it, else
    the plain step's. `zero_grad` and the scheduler's step stay the suites' own."""

    def __init__(self, stack: object | None, plain: PlainStep):
        self.stack = stack
        for name in MEMBERS:
            setattr(self, name, getattr(stack, name, None) or getattr(plain, name))


def build_training_step(components: dict, *, model, optimizer, cell) -> TrainingStep:
    """`[components] training_step` built over this run's model and optimizer (each keyword where its
    signature names it), its missing members filled in by the plain step; the plain step without one."""
    plain = PlainStep(model=model, optimizer=optimizer)
    if "training_step" not in components:
        return TrainingStep(None, plain)
    stack = call_accepting(load(components["training_step"]), model=model, optimizer=optimizer, cell=cell)
    return TrainingStep(stack, plain)
