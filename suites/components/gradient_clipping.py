"""The default `clip_grad_norm` component: clip every gradient by the norm of the whole model's
gradient, across ranks, the way the stacks do it per wrapper."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from torchmatrix.components.pipeline_axis import pipelines
from torchmatrix.matrix.meshes import PP_DIM
from torchmatrix.testing import cell_mesh, fsdp1_root

from ..state.full_tensors import whole


def clip_grad_norm(model, *, max_norm: float, cell: dict | None = None) -> torch.Tensor:
    """Clip in place and return the total 2-norm, a plain tensor equal on every rank.

    A pipelined cell's rank holds its stages only: their norm's square is summed over the cell's "pp"
    ranks first, as torchtitan's clip does over its pp_mesh (`clip_across_stages`).

    FSDP1 (wherever it sits in the wrapper chain): its root's own `clip_grad_norm_`, since
    torch.nn.utils' sees only this rank's flat shards.
    Otherwise `torch.nn.utils.clip_grad_norm_`, whose DTensor norm is read as its full tensor (as
    torchtitan does); where the parameters live on different device meshes (tensor-parallel
    projections beside norms sharded over the data-parallel dims only), DTensor cannot stack their
    norms, so each mesh's norm is taken apart and the total combined from them.
    """
    if cell is not None and pipelines(cell):
        return clip_across_stages(model, max_norm, cell_mesh(cell)[PP_DIM].get_group())
    if (root := fsdp1_root(model)) is not None:
        return root.clip_grad_norm_(max_norm)
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


def clip_across_stages(model, max_norm: float, group) -> torch.Tensor:
    """The norm of every stage's gradient from this rank's stages' (full over their data-parallel ranks), its
    square summed over the pipeline ranks of `group`; each gradient clipped by that total."""
    params = [param for param in model.parameters() if param.grad is not None]
    squared = whole(torch.nn.utils.get_total_norm([param.grad for param in params])) ** 2
    dist.all_reduce(squared, group=group)
    total = squared.sqrt()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total
