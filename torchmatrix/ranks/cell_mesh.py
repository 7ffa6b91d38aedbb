"""The cell's DeviceMesh in a rank process, built from the `mesh` axis (torchmatrix.matrix.meshes),
and which batch each rank trains on under it.

A mesh is built once per shape in a rank process and kept: building a 2-D mesh creates process
groups (a collective over every rank), and a rank pool serves many cells of one world size. Its groups
are named alike whatever the pool built before (torchmatrix.ranks.mesh_cache_keys.group_names_of), so
the graphs compiled over it are found in the compile store in any cell order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchmatrix.components.pipeline_axis import pipeline_ranks
from torchmatrix.matrix.meshes import MeshLayout, mesh_kind, mesh_layout
from torchmatrix.ranks.mesh_cache_keys import group_names_of
from torchmatrix.ranks.worker import current_device

_BUILT: dict[tuple, Any] = {}


def cell_layout(cell: Mapping[str, Any]) -> MeshLayout:
    """The shape and dimension names of the cell's mesh over the default process group (in a rank), or
    over the cell's `world_size` (in the pytest process, which joins no group)."""
    import torch.distributed as dist

    world_size = dist.get_world_size() if dist.is_initialized() else int(cell.get("world_size", 1))
    return mesh_layout(mesh_kind(cell), world_size, pipeline_ranks(cell))


def cell_mesh(cell: Mapping[str, Any], device_type: str | None = None):
    """The DeviceMesh the cell's `mesh` names over every rank of the default process group: 1-D for
    `flat`, ("dp_replicate", "dp_shard") for `hsdp`, ("dp_shard", "tp") for `fsdp_tp`, ("pp", "dp_shard")
    for a pipelined cell (axis `pipeline`). Every rank must
    call it at the same point the first time a shape is asked for (it creates process groups)."""
    from torch.distributed.device_mesh import init_device_mesh

    layout = cell_layout(cell)
    device_type = device_type or current_device().type
    key = (device_type, layout.dim_names, layout.shape)
    if key not in _BUILT:
        with group_names_of(key):
            _BUILT[key] = init_device_mesh(device_type, layout.shape, mesh_dim_names=layout.dim_names)
    return _BUILT[key]


def data_parallel_rank(cell: Mapping[str, Any]) -> int:
    """Which batch this rank trains on: its global rank, except that the ranks of one tensor-parallel
    group share one (they hold slices of the same layers, so they must see the same tokens), as do the
    stages of one pipeline."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    return cell_layout(cell).data_parallel_rank(rank)


def data_parallel_size(cell: Mapping[str, Any]) -> int:
    """How many different batches the cell trains on per step: the world size over the tensor-parallel
    and pipeline sizes."""
    return cell_layout(cell).data_parallel_size()


def mesh_group(mesh):
    """The process group spanning every rank of `mesh`: its own group when 1-D, the world when it spans
    every rank (DCP saves and loads over one group, whatever the mesh's shape)."""
    import torch.distributed as dist

    if mesh.ndim == 1:
        return mesh.get_group()
    if mesh.size() == dist.get_world_size():
        return dist.group.WORLD
    raise ValueError(f"a {mesh.ndim}-D mesh of {mesh.size()} of {dist.get_world_size()} ranks has no one group")
