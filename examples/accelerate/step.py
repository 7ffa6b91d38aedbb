"""The `training_step` component: accelerate's loop as its docs write it, `accelerator.backward(loss)`
under `accelerator.accumulate(model)` (suites/components/training_step.py). The loss is the model's own output,
read by the suites' default `loss`; the prepared optimizer steps as the suites call it."""

from __future__ import annotations

from parallel import ACCELERATORS


class AccelerateStep:
    """Back-propagation by the model's Accelerator inside `accumulate`, which syncs the gradients on
    every step here (one accumulation step)."""

    def __init__(self, *, model, optimizer):
        self.accelerator, self.model = ACCELERATORS[model], model

    def backward(self, loss) -> None:
        with self.accelerator.accumulate(self.model):
            self.accelerator.backward(loss)
