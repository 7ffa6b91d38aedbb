"""The `mesh` axis: which device mesh a cell's ranks form, as shapes and names, without torch.

`flat` (the default, also when a cell has no `mesh` key) is one dimension over every rank.
`hsdp` is FSDP2 replicated across ("dp_replicate") and sharded within ("dp_shard") groups of
ranks, shape (2, world/2); `fsdp_tp` is FSDP2 ("dp_shard") over pairs of tensor-parallel ranks
("tp"), shape (world/2, 2). Both need an even world size of at least 4 (2 x 2) and FSDP2, so
matrix.toml is checked against them when it loads, and the rank side builds them from this one
description (torchmatrix.ranks.cell_mesh). A pipelined cell (axis `pipeline`) gets a flat mesh with a
pipeline dim outside: ("pp", "dp_shard"), shape (pipeline ranks, world/pipeline ranks).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MESH_AXIS = "mesh"
FLAT, HSDP, FSDP_TP = "flat", "hsdp", "fsdp_tp"
MESH_KINDS = (FLAT, HSDP, FSDP_TP)
TWO_D_MESH_KINDS = (HSDP, FSDP_TP)
MIN_TWO_D_WORLD_SIZE = 4
TWO_D_FSDP = "fsdp2"
REPLICATE_DIM, SHARD_DIM, TP_DIM, PP_DIM = "dp_replicate", "dp_shard", "tp", "pp"


@dataclass(frozen=True)
class MeshLayout:
    """One mesh: its kind, its dimension names (None for the unnamed flat mesh) and its shape."""

    kind: str
    dim_names: tuple[str, ...] | None
    shape: tuple[int, ...]

    def size_of(self, dim: str) -> int:
        """The size of dim `dim`, 1 where the mesh has no such dim."""
        return self.shape[self.dim_names.index(dim)] if self.dim_names and dim in self.dim_names else 1

    @property
    def tensor_parallel_size(self) -> int:
        """Ranks that hold slices of the same layers and so must read the same batch (1 without a tp dim)."""
        return self.size_of(TP_DIM)

    def data_parallel_size(self) -> int:
        """How many different batches the cell's ranks train on in one step: the ranks of one pipeline
        (its stages) or of one tp group (slices of the same layers) share one."""
        return math.prod(self.shape) // self.tensor_parallel_size // self.size_of(PP_DIM)

    def data_parallel_rank(self, rank: int) -> int:
        """Which of those batches `rank` trains on; the tp dim is the innermost, so a tp group is consecutive ranks,
        and the pp dim the outermost, so the stages of one pipeline lie a data-parallel size apart."""
        return rank % (math.prod(self.shape) // self.size_of(PP_DIM)) // self.tensor_parallel_size


def mesh_kind(cell: Mapping[str, Any]) -> str:
    """The cell's `mesh` value; `flat` where the cell has none, as every matrix had before the axis existed."""
    return str(cell.get(MESH_AXIS, FLAT))


def mesh_layout(kind: str, world_size: int, pipeline_ranks: int = 1) -> MeshLayout:
    """The mesh `kind` names at `world_size` ranks, with a pipeline dim of `pipeline_ranks` outside where
    that is above 1; ValueError (saying why) where it has none."""
    if kind not in MESH_KINDS:
        raise ValueError(f"mesh={kind!r} is not a mesh: expected one of {', '.join(MESH_KINDS)}")
    if pipeline_ranks > 1:
        if kind != FLAT or world_size % pipeline_ranks:
            raise ValueError(
                f"a pipeline of {pipeline_ranks} ranks needs mesh='flat' and a world_size that is a multiple"
            )
        return MeshLayout(FLAT, (PP_DIM, SHARD_DIM), (pipeline_ranks, world_size // pipeline_ranks))
    if kind == FLAT:
        return MeshLayout(FLAT, None, (world_size,))
    if world_size < MIN_TWO_D_WORLD_SIZE or world_size % 2:
        raise ValueError(
            f"mesh={kind!r} needs an even world_size of at least {MIN_TWO_D_WORLD_SIZE} (2 x world_size/2), not {world_size}"
        )
    if kind == HSDP:
        return MeshLayout(HSDP, (REPLICATE_DIM, SHARD_DIM), (2, world_size // 2))
    return MeshLayout(FSDP_TP, (SHARD_DIM, TP_DIM), (world_size // 2, 2))


def mesh_problem(cell: Mapping[str, Any]) -> str | None:
    """Why no rank can ever build the cell's mesh (unknown kind, world size, a 2-D mesh without FSDP2), or None."""
    kind = mesh_kind(cell)
    try:
        mesh_layout(kind, int(cell.get("world_size", 1)))
    except ValueError as error:
        return str(error)
    if kind in TWO_D_MESH_KINDS and "fsdp" in cell and cell["fsdp"] != TWO_D_FSDP:
        return f"mesh={kind!r} shards with FSDP2 (fully_shard over a 2-D mesh), so it needs fsdp={TWO_D_FSDP!r}, not {cell['fsdp']!r}"
    return None
