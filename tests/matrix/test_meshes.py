"""The `mesh` axis as data: each kind's shape and dim names at a world size, and which batch a rank trains on."""

from __future__ import annotations

import pytest

from torchmatrix.matrix.meshes import mesh_kind, mesh_layout, mesh_problem


@pytest.mark.parametrize(
    "kind, world_size, names, shape",
    [
        ("flat", 1, None, (1,)),
        ("flat", 4, None, (4,)),
        ("hsdp", 4, ("dp_replicate", "dp_shard"), (2, 2)),
        ("hsdp", 8, ("dp_replicate", "dp_shard"), (2, 4)),
        ("fsdp_tp", 4, ("dp_shard", "tp"), (2, 2)),
        ("fsdp_tp", 8, ("dp_shard", "tp"), (4, 2)),
    ],
)
def test_each_kind_has_the_contracts_shape(kind, world_size, names, shape):
    layout = mesh_layout(kind, world_size)
    assert (layout.kind, layout.dim_names, layout.shape) == (kind, names, shape)


def test_tensor_parallel_ranks_share_a_batch():
    """The tp dim is the innermost, so ranks 2k and 2k+1 form a tp group and read batch k."""
    tp = mesh_layout("fsdp_tp", 8)
    assert [tp.data_parallel_rank(rank) for rank in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert tp.data_parallel_size() == 4
    hsdp = mesh_layout("hsdp", 8)
    assert [hsdp.data_parallel_rank(rank) for rank in range(8)] == list(range(8))
    assert hsdp.data_parallel_size() == 8


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_a_2d_mesh_needs_an_even_world_of_at_least_4(world_size):
    with pytest.raises(ValueError, match=f"needs an even world_size of at least 4 .* not {world_size}"):
        mesh_layout("hsdp", world_size)


def test_problems_of_a_cell():
    assert mesh_kind({}) == "flat" and mesh_problem({"world_size": 1}) is None
    assert mesh_problem({"world_size": 4, "fsdp": "fsdp2", "mesh": "fsdp_tp"}) is None
    assert "needs fsdp='fsdp2', not 'fsdp1'" in mesh_problem({"world_size": 4, "fsdp": "fsdp1", "mesh": "hsdp"})
    assert mesh_problem({"world_size": 4, "mesh": "hsdp"}) is None  # a stack without an fsdp axis
    assert "is not a mesh" in mesh_problem({"world_size": 4, "mesh": "3d"})


def test_a_pipeline_puts_its_stages_outside_the_data_parallel_ranks():
    """A pipelined cell's mesh is ("pp", "dp_shard"): the ranks of one pipeline lie a data-parallel size apart
    and read one batch, so there are world / pipeline ranks batches per step."""
    alone = mesh_layout("flat", 2, pipeline_ranks=2)
    assert (alone.dim_names, alone.shape, alone.data_parallel_size()) == (("pp", "dp_shard"), (2, 1), 1)
    assert [alone.data_parallel_rank(rank) for rank in range(2)] == [0, 0]
    sharded = mesh_layout("flat", 4, pipeline_ranks=2)
    assert (sharded.shape, sharded.data_parallel_size()) == ((2, 2), 2)
    assert [sharded.data_parallel_rank(rank) for rank in range(4)] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="a pipeline of 2 ranks needs mesh='flat'"):
        mesh_layout("hsdp", 4, pipeline_ranks=2)
