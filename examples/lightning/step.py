"""The `training_step` component: Fabric's training step as a Fabric loop writes it, the loss
function applied to the model's output and `fabric.backward(loss)` (suites/components/training_step.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from parallel import FABRICS


class FabricStep:
    """`nll_loss` of the demo Transformer's log-probabilities for the next tokens, the model called
    through Fabric's `_FabricModule` (its precision's autocast), back-propagated by
    the model's Fabric (its strategy and precision plugin; FSDPStrategy refuses a plain
    `loss.backward()`). The optimizer steps as set up: `optimizer.step()` through Fabric's wrapper."""

    def __init__(self, *, model, optimizer):
        self.fabric, self.model = FABRICS[model], model

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        inputs, target = tokens[:, :-1], tokens[:, 1:]
        return F.nll_loss(self.model(inputs, target), target.reshape(-1))

    def backward(self, loss: torch.Tensor) -> None:
        self.fabric.backward(loss)
