"""A world of its own beside the cell's: ranks of another size whose default process group is exactly
them (what dtensor_optim's reshard needs for a stack that builds its mesh or saves over the whole
default group), under the test's deadline and in compile-cache folders of their own."""

from __future__ import annotations

import os
import time

import pytest

from torchmatrix.matrix.cells import Cell
from torchmatrix.ranks.cell_ranks import Ranks
from torchmatrix.ranks.launched import LaunchedRank
from torchmatrix.ranks.pool import RankPool
from torchmatrix.ranks.worker import COMPILE_CACHE_VARIABLE, in_compile_cache

from helpers import rank_functions as rf


class RecordingPool:
    """A rank group that records what each run sends and answers one None per rank."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.calls = []

    def run(self, fn, args, *, deadline, name):
        self.calls.append((args, deadline))
        return [None] * self.world_size


def test_another_world_runs_on_its_own_ranks_under_the_same_deadline(tmp_path):
    cell_pool, other_pool = RecordingPool(2), RecordingPool(1)
    opened = []
    ranks = Ranks(cell_pool, Cell({"world_size": 2}), 60, str(tmp_path), lambda size: opened.append(size) or other_pool)
    other = ranks.in_world(1)
    assert other.world_size == 1 and other.pool is other_pool and opened == [1]
    assert other.in_world(2) is ranks, "the cell's own size is the cell's own ranks"
    assert ranks.in_world(2) is ranks
    other.run(print)
    ranks.run(print)
    (directory, _, _, world, _), deadline = other_pool.calls[0]
    assert (directory, world, deadline) == (str(tmp_path), "-of-1", ranks.deadline)
    assert cell_pool.calls[0][0][3] == "", "the cell's ranks keep their own folders"


def test_ranks_that_cannot_open_a_world_skip_the_test_saying_why():
    def launched(size):
        return LaunchedRank(4, backend="gloo", collective_timeout_s=60).of_size(size)

    with pytest.raises(pytest.skip.Exception, match="launcher fixed the world at 4"):
        Ranks(RecordingPool(4), Cell({"world_size": 4}), 60, "/nowhere", launched).in_world(2)
    with pytest.raises(pytest.skip.Exception, match="cannot open a world of 2"):
        Ranks(RecordingPool(4), Cell({"world_size": 4}), 60, "/nowhere").in_world(2)


def test_a_rank_of_another_world_compiles_into_a_folder_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv(COMPILE_CACHE_VARIABLE, raising=False)
    for world, folder in (("", "rank0"), ("-of-1", "rank0-of-1")):
        assert in_compile_cache(str(tmp_path), os.environ.get, (COMPILE_CACHE_VARIABLE,), world) == str(
            tmp_path / folder
        )


@pytest.mark.slow
def test_a_pool_of_another_size_is_a_default_group_of_that_size():
    pool = RankPool(2, device_type="cpu", backend="gloo", collective_timeout_s=60)
    other = pool.of_size(1)
    try:
        deadline = time.monotonic() + 120
        assert [(rank, size) for rank, size, _ in pool.run(rf.identity, (), deadline=deadline)] == [(0, 2), (1, 2)]
        assert [(rank, size) for rank, size, _ in other.run(rf.identity, (), deadline=deadline)] == [(0, 1)]
    finally:
        other.close()
        pool.close()
    assert not other.running and not pool.running
