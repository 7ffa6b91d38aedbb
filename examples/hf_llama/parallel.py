"""The `parallelize` component: transformers' own activation checkpointing, then FSDP1 or FSDP2
with one unit per module class the model names in `_no_split_modules`, as Hugging Face's
accelerate wraps it (torchmatrix/components/protocol.py)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


def parallelize(
    model: nn.Module,
    cell: Mapping[str, object],
    *,
    device: torch.device,
    activation_checkpointing: bool = False,
    mesh: DeviceMesh | None = None,
) -> nn.Module:
    """Checkpointing through `activation_checkpointing_enable` (non-reentrant), then `cell["fsdp"]`."""
    if activation_checkpointing:
        model.activation_checkpointing_enable()
    if cell["fsdp"] == "none":
        return model.to(device)
    mesh = mesh or init_device_mesh(device.type, (dist.get_world_size(),))
    no_split = getattr(model, "_no_split_modules", None) or []
    units = [module for module in model.modules() if type(module).__name__ in no_split]
    if cell["fsdp"] == "fsdp1":
        policy = ModuleWrapPolicy({type(unit) for unit in units})
        return FullyShardedDataParallel(
            model, auto_wrap_policy=policy, process_group=mesh.get_group(), device_id=device, use_orig_params=True
        )
    model.to(device)
    for unit in units:
        fully_shard(unit, mesh=mesh)
    return fully_shard(model, mesh=mesh)
