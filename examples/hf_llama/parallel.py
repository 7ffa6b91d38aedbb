"""The `parallelize` component for the Hugging Face Llama: transformers' own gradient
checkpointing, then FSDP1 or FSDP2 with one unit per decoder layer (torchmatrix/components/protocol.py).

The FSDP wrapping is the reference one (models/parallel.py): it only needs `decoder_layers()`,
which the suites' probe model has too.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from torchmatrix.models.parallel import FSDP_KINDS, shard_fsdp2, wrap_fsdp1


def parallelize(
    model: nn.Module,
    cell: Mapping[str, object],
    *,
    device: torch.device,
    activation_checkpointing: bool = False,
    mesh: DeviceMesh | None = None,
) -> nn.Module:
    """Checkpointing through `gradient_checkpointing_enable` (non-reentrant), then `cell["fsdp"]`."""
    fsdp = cell["fsdp"]
    if fsdp not in FSDP_KINDS:
        raise ValueError(f"cell axis fsdp={fsdp!r}: expected one of {', '.join(FSDP_KINDS)}")
    if activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if fsdp == "none":
        return model.to(device)
    if mesh is None:
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    if fsdp == "fsdp1":
        return wrap_fsdp1(model, device, mesh)
    return shard_fsdp2(model, device, mesh)
