"""The default `clip_grad_norm` component: clip every gradient by the norm of the whole model's
gradient, across ranks, the way the stacks do it per wrapper."""

from __future__ import annotations

import torch
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.tensor import DTensor

from .full_tensors import whole


def clip_grad_norm(model, *, max_norm: float) -> torch.Tensor:
    """Clip in place and return the total 2-norm, a plain tensor equal on every rank.

    FSDP1: its own `clip_grad_norm_`, since torch.nn.utils' sees only this rank's flat shards.
    Otherwise `torch.nn.utils.clip_grad_norm_`, whose DTensor norm is read as its full tensor (as
    torchtitan does); where the parameters live on different device meshes (tensor-parallel
    projections beside norms sharded over the data-parallel dims only), DTensor cannot stack their
    norms, so each mesh's norm is taken apart and the total combined from them.
    """
    if isinstance(model, FullyShardedDataParallel):
        return model.clip_grad_norm_(max_norm)
    by_mesh: dict[object, list[torch.nn.Parameter]] = {}
    for param in model.parameters():
        if param.grad is not None:
            by_mesh.setdefault(param.grad.device_mesh if isinstance(param.grad, DTensor) else None, []).append(param)
    if len(by_mesh) <= 1:
        return whole(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    norms = [whole(torch.nn.utils.get_total_norm([p.grad for p in params])) for params in by_mesh.values()]
    total = torch.linalg.vector_norm(torch.stack(norms))
    for params in by_mesh.values():
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total
