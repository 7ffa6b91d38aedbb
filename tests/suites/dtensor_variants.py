"""The model and checkpointer for one run of the dtensor_optim suite over the reference checkpointer and
its per-call mutants side by side: an `optimizer` axis value of CHECKPOINTER_VARIANTS builds the reference
precision-aware optimizer marked with that value, and `Checkpointer` saves and loads each stack through
the checkpointer its optimizer names (the reference one for every other optimizer), so one rank pool
serves them all; `build_model` builds the reference decoder, one layer a stack deep but for the reference."""

from __future__ import annotations

from torchmatrix.models import transformer
from torchmatrix.models.optim import DEFAULT_IMPLEMENTATION, build_precision_aware
from torchmatrix.testing import load

REFERENCE_OPTIMIZER = "precision_aware"
REFERENCE_CHECKPOINTER = "torchmatrix.models.checkpoint:Checkpointer"
# optimizer axis value -> the checkpointer its cells save and load with
CHECKPOINTER_VARIANTS = {
    "unsharded_save": "torchmatrix.models.mutants.dtensor_state:UnshardedOptimizerCheckpointer",
    "raw_state_dict": "torchmatrix.models.mutants.resume:RawOptimizerStateCheckpointer",
}


BETAS, EPS = (0.9, 0.999), 1e-8


def build_model(cell, **keywords):
    """The reference decoder, as deep as the product builds the cell for the reference optimizer, one layer a
    stack for a mutant optimizer or checkpointer: what one gets wrong of a state, it gets wrong in every layer."""
    if cell["optimizer"] != REFERENCE_OPTIMIZER:
        cell = {**cell, transformer.DEPTH_AXIS: 1}
    return transformer.build_model(cell, **keywords)


def saved_by(variant: str, params, **settings):
    """The reference optimizer over `params`, marked with the checkpointer variant that saves it."""
    optimizer = build_precision_aware(params, **settings)
    optimizer.checkpointer_variant = variant
    return optimizer


def build_unsharded_save(params, *, lr, betas=BETAS, eps=EPS, weight_decay=0.0, implementation=DEFAULT_IMPLEMENTATION):
    """The reference optimizer, saved by the checkpointer that gathers its state whole."""
    return saved_by(
        "unsharded_save", params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, implementation=implementation
    )


def build_raw_state_dict(params, *, lr, betas=BETAS, eps=EPS, weight_decay=0.0, implementation=DEFAULT_IMPLEMENTATION):
    """The reference optimizer, saved by the checkpointer that round-trips `optimizer.state_dict()`."""
    return saved_by(
        "raw_state_dict", params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, implementation=implementation
    )


class Checkpointer:
    """A per-call checkpointer that hands each call to the checkpointer the optimizer names."""

    def __init__(self):
        self.chosen = {}

    def of(self, optimizer):
        path = CHECKPOINTER_VARIANTS.get(getattr(optimizer, "checkpointer_variant", None), REFERENCE_CHECKPOINTER)
        if path not in self.chosen:
            self.chosen[path] = load(path)()
        return self.chosen[path]

    def save(self, directory: str, *, model, optimizer, scheduler, loader, step: int):
        return self.of(optimizer).save(
            directory, model=model, optimizer=optimizer, scheduler=scheduler, loader=loader, step=step
        )

    def load(self, directory: str, *, model, optimizer, scheduler, loader):
        return self.of(optimizer).load(directory, model=model, optimizer=optimizer, scheduler=scheduler, loader=loader)
