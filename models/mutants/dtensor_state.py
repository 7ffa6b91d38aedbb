"""Precision-aware AdamW variants that lay out their state wrongly for DTensor params, each the
way a real optimizer has, one that loads its state and then ignores it, and checkpointers that save
right state unsharded or never load the optimizer; the dtensor_optim suite must fail on every one.

Each layout mutant changes only how the reference optimizer wraps a state shard; the update itself
still runs on local shards, so training looks healthy and only the layout is wrong.
Point `[components] optimizer_precision_aware` at one of these classes (or `checkpointer` at
`UnshardedOptimizerCheckpointer`) to run the suite on it.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor, Replicate

from ..checkpoint import BoundCheckpointer, Checkpointer, ReplicatedRngCheckpointer
from ..optim import PrecisionAwareAdamW, local_tensor

FULL = StateDictOptions(full_state_dict=True)


class PlainLocalStateAdamW(PrecisionAwareAdamW):
    """Keeps every state tensor as the bare local shard, as TransformerEngine's FusedAdam did
    before NVIDIA/TransformerEngine#2795: DCP then treats each rank's shard as a whole tensor."""

    def _initial_state(self, param: torch.Tensor) -> dict:
        return {key: local_tensor(value) for key, value in super()._initial_state(param).items()}


class ReplicatedStateAdamW(PrecisionAwareAdamW):
    """Wraps each state shard as a DTensor on the param's mesh but marked Replicate, so its
    global shape is one shard and DCP keeps a single rank's copy."""

    def _initial_state(self, param: torch.Tensor) -> dict:
        return {key: _rewrapped(value, replicate=True) for key, value in super()._initial_state(param).items()}


class ShapelessStateAdamW(PrecisionAwareAdamW):
    """Wraps each state shard with `DTensor.from_local` without the global shape and stride:
    right when shards are even, a wrong global shape (local size x world size) when they are not."""

    def _initial_state(self, param: torch.Tensor) -> dict:
        return {key: _rewrapped(value, replicate=False) for key, value in super()._initial_state(param).items()}


class ShapelessOnLoadAdamW(PrecisionAwareAdamW):
    """Lays out new state right, but re-wraps each loaded state shard with `DTensor.from_local`
    without the global shape: after `load_state_dict` into uneven shards every rank believes in
    another global shape (local size x world size), and the first gather of the state crashes."""

    def _loaded_state_value(self, param: torch.Tensor, key: str, value):
        return _rewrapped(super()._loaded_state_value(param, key, value), replicate=False)


class LoadedMomentsIgnoredAdamW(PrecisionAwareAdamW):
    """Loads its state exactly, so a comparison right after the load finds nothing, then ignores the
    loaded moments: the first step after a load starts them from zero again, as an optimizer whose
    step reads its moments from a helper that `load_state_dict` never fills does."""

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.moments_ignored = set(self.state)

    def _update(self, param: torch.Tensor, group: dict) -> None:
        if param in getattr(self, "moments_ignored", ()):
            self.moments_ignored.discard(param)
            for key in ("exp_avg", "exp_avg_sq"):
                local_tensor(self.state[param][key]).zero_()
        super()._update(param, group)


def _rewrapped(value: torch.Tensor, *, replicate: bool) -> torch.Tensor:
    """Re-wrap a correctly laid out DTensor state from its local shard alone; plain tensors pass."""
    if not isinstance(value, DTensor):
        return value
    mesh = value.device_mesh
    placements = [Replicate()] * mesh.ndim if replicate else value.placements
    return DTensor.from_local(value.to_local(), mesh, placements, run_check=False)


class UnshardedOptimizerCheckpointer(Checkpointer):
    """Saves the optimizer state as full tensors (`full_state_dict=True` gathers each one whole),
    as a checkpointer that consolidates state for portability does: DCP then stores every state
    once, in a single chunk written by one rank, and each save moves the whole state through one
    rank. Torch's state-dict helpers on their own still give sharded state, so only a suite that
    reads what the checkpointer wrote sees it."""

    def optimizer_state(self, model, optimizer) -> dict:
        return get_optimizer_state_dict(model, optimizer, options=FULL)

    def restore_optimizer(self, model, optimizer, state: dict) -> None:
        set_optimizer_state_dict(model, optimizer, state, options=FULL)


class KeepsBuiltOptimizerCheckpointer(ReplicatedRngCheckpointer):
    """Restores everything but the optimizer, which keeps the state it was built with."""

    def restore_optimizer(self, model, optimizer, state: dict) -> None:
        pass


class OptimizerNotLoadedBoundCheckpointer(BoundCheckpointer):
    """A checkpoint manager that takes a process group, saves the optimizer state sharded, and never
    loads it back: the reshard through it leaves the optimizer fresh, while torch's helpers, which a
    suite that ignores the user's checkpointer would reshard with, restore it exactly."""

    pieces_class = KeepsBuiltOptimizerCheckpointer


class OptimizerNotLoadedWorldCheckpointer(OptimizerNotLoadedBoundCheckpointer):
    """The same manager without a `process_group`: it saves and loads over the whole default group, as
    a manager that makes its own process group does, so its reshard runs in worlds of their own; there
    too it leaves the optimizer fresh."""

    def __init__(self, directory: str, *, model, optimizer, scheduler, loader):
        super().__init__(directory, model=model, optimizer=optimizer, scheduler=scheduler, loader=loader)
