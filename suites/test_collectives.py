"""Collective sanity: every rank of the cell joined one process group and collectives agree.

It is the cheapest end-to-end proof that the runner, the rank pool and the device wiring work
for a cell before the heavier suites spend time on it.
"""

import torch
import torch.distributed as dist

from torchmatrix.testing import CollectivesOptions, current_device

OPTIONS = CollectivesOptions  # the dataclass `suite_options` arrives as


def _rank_identity():
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "device": str(current_device())}


def _all_reduce_sum():
    value = torch.tensor([float(dist.get_rank() + 1)], device=current_device())
    dist.all_reduce(value)
    return value.item()


def _all_gather_ranks():
    world = dist.get_world_size()
    gathered = [torch.zeros(1, device=current_device()) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([float(dist.get_rank())], device=current_device()))
    return [int(t.item()) for t in gathered]


def test_every_rank_joined(cell, ranks):
    identities = ranks.run(_rank_identity)
    world = cell.world_size
    assert [i["rank"] for i in identities] == list(range(world)), f"ranks answered out of order: {identities}"
    assert all(i["world_size"] == world for i in identities), (
        f"process group size differs from the cell's world size {world}: {identities}"
    )


def test_all_reduce_sums_over_ranks(cell, ranks):
    world = cell.world_size
    expected = world * (world + 1) / 2
    assert ranks.run(_all_reduce_sum) == [expected] * world


def test_all_gather_orders_by_rank(cell, ranks):
    world = cell.world_size
    assert ranks.run(_all_gather_ranks) == [list(range(world))] * world
