"""A cell's mesh names its process groups alike whatever groups its rank pool made before, so a graph
compiled over it in one cell order is found in the compile store in another; and the names still
call the right groups."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest

from torchmatrix.ranks.mesh_cache_keys import GROUP_NAME_BASE, group_name_base
from torchmatrix.ranks.pool import RankPool

from helpers.mesh_group_names import groups_named_after, sub_world_names_after

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def _four_ranks() -> Iterator[RankPool]:
    """A fresh pool of four gloo ranks: processes that made no group but the world."""
    pool = RankPool(4, device_type="cpu", backend="gloo", collective_timeout_s=60)
    try:
        yield pool
    finally:
        pool.close()


def _run(pool: RankPool, fn, *args) -> list:
    return pool.run(fn, args, deadline=time.monotonic() + 120)


def _names(pool: RankPool, groups_before: int, kinds: list[str], through_cell_mesh: bool = True) -> list[dict]:
    """Each rank's mesh names; every dim's collective summed its own ranks."""
    results = _run(pool, groups_named_after, groups_before, kinds, through_cell_mesh)
    for result in results:
        assert all(result["sums_right"].values()), result["sums_right"]
    return [result["names"] for result in results]


def test_the_tensor_parallel_mesh_is_named_alike_after_other_meshes_and_groups():
    with _four_ranks() as pool:
        alone = _names(pool, 0, ["fsdp_tp"])
    with _four_ranks() as pool:
        after_others = _names(pool, 3, ["hsdp", "fsdp_tp"])
    assert [ranks["fsdp_tp"] for ranks in alone] == [ranks["fsdp_tp"] for ranks in after_others]
    assert all(int(name) >= GROUP_NAME_BASE for ranks in alone for name in ranks["fsdp_tp"])
    assert not set(after_others[0]["hsdp"]) & set(after_others[0]["fsdp_tp"]), "two meshes, names of their own"


def test_dtensor_optims_sub_worlds_are_named_alike_after_other_groups():
    with _four_ranks() as pool:
        alone = _run(pool, sub_world_names_after, 0)
    with _four_ranks() as pool:
        after_others = _run(pool, sub_world_names_after, 2)
    assert alone == after_others
    assert [len(ranks) for ranks in alone] == [3, 2, 1, 0], "rank r is in the sub-worlds larger than r"


def test_torch_alone_names_it_by_what_came_before():
    """The control: without the mesh's own range its names move with the groups made before it."""
    with _four_ranks() as pool:
        alone = _names(pool, 0, ["fsdp_tp"], through_cell_mesh=False)
    with _four_ranks() as pool:
        after_others = _names(pool, 3, ["hsdp", "fsdp_tp"], through_cell_mesh=False)
    assert [ranks["fsdp_tp"] for ranks in alone] != [ranks["fsdp_tp"] for ranks in after_others]


def test_a_mesh_whose_range_is_taken_keeps_torchs_names_and_its_collectives_reach_its_groups():
    with _four_ranks() as pool:
        first = _names(pool, 0, ["fsdp_tp"])
        again = _names(pool, 0, ["fsdp_tp"])  # the same shape built again in the same processes
    assert all(int(name) >= GROUP_NAME_BASE for name in first[0]["fsdp_tp"])
    assert all(int(name) < GROUP_NAME_BASE for name in again[0]["fsdp_tp"])


def test_each_mesh_shape_and_device_has_a_range_of_its_own():
    keys = [
        ("cpu", ("dp_shard", "tp"), (2, 2)),
        ("cpu", ("dp_replicate", "dp_shard"), (2, 2)),
        ("cuda", ("dp_shard", "tp"), (2, 2)),
    ]
    assert len({group_name_base(key) for key in keys}) == len(keys)
    assert group_name_base(keys[0]) == group_name_base(("cpu", ("dp_shard", "tp"), (2, 2)))
