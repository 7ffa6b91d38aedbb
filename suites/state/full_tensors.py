"""Whole parameters and gradients of a wrapped model, as one process would hold them, by the model's
own names: gathered by FSDP1's root wherever it sits in the wrapper chain, or from DTensors (FSDP2,
HSDP, tensor parallel); both are collectives, so every rank calls them at the same point."""

from __future__ import annotations

import torch
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.tensor import DTensor

from torchmatrix.testing import fsdp1_root

from .built_names import named_parameters_as_built


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's full tensor (a collective), or the tensor itself."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def full_gradients(model) -> dict[str, torch.Tensor]:
    """Unsharded gradients: summon_full_params(with_grads=True) for FSDP1, DTensor.full_tensor otherwise."""
    if (root := fsdp1_root(model)) is not None:
        with FullyShardedDataParallel.summon_full_params(root, with_grads=True):
            return {n: p.grad.detach().clone() for n, p in named_parameters_as_built(model) if p.grad is not None}
    return {n: whole(p.grad).detach().clone() for n, p in named_parameters_as_built(model) if p.grad is not None}


def full_parameters(model) -> dict[str, torch.Tensor]:
    """Unsharded parameters: summon_full_params for FSDP1, DTensor.full_tensor otherwise."""
    if (root := fsdp1_root(model)) is not None:
        with FullyShardedDataParallel.summon_full_params(root):
            return {n: p.detach().clone() for n, p in named_parameters_as_built(model)}
    return {n: whole(p).detach().clone() for n, p in named_parameters_as_built(model)}
