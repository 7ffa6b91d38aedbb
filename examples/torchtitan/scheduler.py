"""The `scheduler` component: torchtitan's own `LRSchedulersContainer` (linear warm-up, then linear
decay to zero over the run), built from its config as its trainer builds it
(torchmatrix/components/protocol.py)."""

from __future__ import annotations

from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer


def build_lr_schedulers(optimizer, *, warmup_steps: int, total_steps: int) -> LRSchedulersContainer:
    """One LambdaLR per optimizer in torchtitan's `OptimizersContainer` (optim.py)."""
    config = LRSchedulersContainer.Config(warmup_steps=warmup_steps)
    return config.build(optimizers=optimizer, training_steps=total_steps)
