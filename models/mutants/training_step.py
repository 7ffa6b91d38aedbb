"""A known-bad `training_step` component: a step that skips something a resume must bring back,
which suites/test_resume.py must fail on (tests/suites/test_resume_mutants.py).

Point `[components] training_step` at it to see it caught.
"""

from __future__ import annotations

import torch


class UncheckpointedLossScalerStep:
    """A dynamic loss scaler kept by the step and left out of the checkpoint, as a trainer that
    forgets to save its `torch.amp.GradScaler`: it scales the loss by 2**16, and skips the optimizer
    step while it calibrates (its first step, as GradScaler skips a step whose scaled gradients
    overflowed, halving its scale), then unscales the gradients (exact: a power of two) and steps.
    A resumed run builds a fresh scaler, which skips its first step again: one update fewer."""

    def __init__(self, *, model, optimizer):
        self.model = model
        self.optimizer = optimizer
        self.scale = 2.0**16
        self.calibrated = False

    def backward(self, loss: torch.Tensor) -> None:
        (loss * self.scale).backward()

    def optimizer_step(self) -> None:
        if not self.calibrated:
            self.calibrated = True
            self.scale /= 2
            return
        for param in self.model.parameters():
            if param.grad is not None:
                param.grad.div_(self.scale)
        self.optimizer.step()
