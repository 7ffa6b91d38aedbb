"""The `checkpointer` component: torchtitan's own `CheckpointManager` (DCP, one `step-N` folder
per save), given the suites' model, optimizer, scheduler and loader as its trainer would
(torchmatrix/components/protocol.py).
"""

from __future__ import annotations

from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.optimizer.utils import (
    get_flat_optim_state_dict,
    init_optim_state,
    load_flat_optim_state_dict,
)


class FlatOptimizer:
    """The optimizer as torchtitan's `OptimizersContainer` checkpoints it: a flat, FQN-keyed state
    dict built by torchtitan's own helpers, keyed by the `param_names` the optimizer was built with.
    The container itself cannot be the `optimizer` component: its `.state` is empty and its param
    groups hold no `lr` (the inner optimizers do)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def state_dict(self) -> dict:
        init_optim_state(self.optimizer)
        return get_flat_optim_state_dict(self.optimizer)

    def load_state_dict(self, state: dict) -> None:
        init_optim_state(self.optimizer)
        load_flat_optim_state_dict(self.optimizer, state)


class TrainState:
    """The step, as torchtitan's trainer checkpoints its own `train_state`."""

    def __init__(self, step: int = 0):
        self.step = step

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


class Checkpointer:
    """`save` and `load` through a `CheckpointManager` over `directory` (its checkpoint folder)."""

    def save(self, directory: str, *, model, optimizer, scheduler, loader, step: int) -> None:
        self.manager(directory, model, optimizer, scheduler, loader, TrainState(step)).save(step)

    def load(self, directory: str, *, model, optimizer, scheduler, loader) -> int:
        train_state = TrainState()
        if not self.manager(directory, model, optimizer, scheduler, loader, train_state).load():
            raise FileNotFoundError(f"CheckpointManager found no checkpoint in {directory}")
        return train_state.step

    def config(self, directory: str) -> CheckpointManager.Config:
        """Saving at every step (interval 1) with the full training state, as during training."""
        return CheckpointManager.Config(enable=True, folder=directory, interval=1, keep_latest_k=0)

    def manager(self, directory: str, model, optimizer, scheduler, loader, train_state) -> CheckpointManager:
        return CheckpointManager(
            self.config(directory),
            dataloader=loader,
            model_parts=[model],
            optimizers=FlatOptimizer(optimizer),
            lr_schedulers=scheduler,
            states={"train_state": train_state},
            sd_adapter=None,
        )
