"""Apply a cell's data-parallel wrapper (fsdp = none | fsdp1 | fsdp2), activation checkpointing and compile.

Order, as torchtitan's parallelize functions and the PyTorch FSDP docs have it: switch
checkpointing on per layer first, then compile each layer (cell key ``compile``, models/block_compile.py),
then shard each layer, then the root. Every FSDP unit
therefore wraps one whole checkpointed layer, so its parameters are gathered before the
layer's recompute runs during backward (FSDP2: ``fully_shard`` on each block, then on the
model; FSDP1: the same units through ``ModuleWrapPolicy``, which is the structure
``apply_activation_checkpointing`` after wrapping produces).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from .block_compile import compile_blocks

FSDP_KINDS = ("none", "fsdp1", "fsdp2")


def parallelize(
    model: nn.Module,
    cell: Mapping[str, object],
    *,
    device: torch.device,
    activation_checkpointing: bool = False,
    mesh: DeviceMesh | None = None,
) -> nn.Module:
    """Component ``parallelize``: the model ready to train on ``device`` under ``cell["fsdp"]``.

    ``model`` must offer ``decoder_layers()`` (the checkpointing and sharding units, each
    with a boolean ``checkpointing`` attribute). FSDP shards over ``mesh``, a 1-D mesh of
    ``device``'s type; by default one spanning every rank of the default process group.
    """
    fsdp = cell["fsdp"]
    if fsdp not in FSDP_KINDS:
        raise ValueError(f"cell axis fsdp={fsdp!r}: expected one of {', '.join(FSDP_KINDS)}")
    for layer in model.decoder_layers():
        layer.checkpointing = activation_checkpointing
    compile_blocks(model, cell)
    if fsdp == "none":
        return model.to(device)
    if mesh is None:
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    if fsdp == "fsdp1":
        return wrap_fsdp1(model, device, mesh)
    return shard_fsdp2(model, device, mesh)


def wrap_fsdp1(model: nn.Module, device: torch.device, mesh: DeviceMesh) -> FullyShardedDataParallel:
    """FSDP1 with one unit per decoder layer plus the root; ``device_id`` makes it work on CPU too.

    ``use_orig_params=True`` keeps per-parameter names and gradients visible, which the
    suites compare and ``summon_full_params(with_grads=True)`` needs.
    """
    layer_types = {type(layer) for layer in model.decoder_layers()}
    return FullyShardedDataParallel(
        model,
        auto_wrap_policy=ModuleWrapPolicy(layer_types),
        process_group=mesh.get_group(),
        device_id=device,
        use_orig_params=True,
    )


def shard_fsdp2(model: nn.Module, device: torch.device, mesh: DeviceMesh) -> nn.Module:
    """FSDP2: ``fully_shard`` each decoder layer, then the root."""
    model.to(device)
    for layer in model.decoder_layers():
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model
