"""The `scheduler` component: the stack's own LR scheduler builder, run as its trainer runs it, or
the suites' warm-up schedule when matrix.toml names none; and what of a scheduler a resume compares."""

from __future__ import annotations

import torch

from torchmatrix.testing import call_accepting, load

DEFAULT_SCHEDULER = "torchmatrix.suites.components.scheduler_component:warmup_scheduler"


def warmup_scheduler(optimizer, *, warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up to the optimizer's LR over `warmup_steps`, then constant: a resume that
    restarts the warm-up shows in the LR."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup_steps))


def build_scheduler(components: dict, optimizer, *, warmup_steps: int, total_steps: int, cell):
    """`[components] scheduler` (or the warm-up default) over `optimizer`, given each keyword its signature names."""
    factory = load(components.get("scheduler", DEFAULT_SCHEDULER))
    return call_accepting(factory, optimizer, warmup_steps=warmup_steps, total_steps=total_steps, cell=cell)


def scheduler_position(scheduler) -> dict:
    """What a resume must bring back of a scheduler: `last_epoch` and the current LR where it has
    them (torch's schedulers), else its whole state dict (a container of schedulers, say)."""
    position = {}
    if hasattr(scheduler, "last_epoch"):
        position["last_epoch"] = scheduler.last_epoch
    if callable(getattr(scheduler, "get_last_lr", None)):
        position["current LR"] = list(scheduler.get_last_lr())
    return position or {"state_dict": scheduler.state_dict()}
