"""A deadline that kills a cell's ranks, or a rank that dies or is killed after another failed, discards
what the cell's ranks compiled: a rank killed while Inductor linked a kernel leaves a truncated .so behind
("file too short", seen on 2.15.0 in the modern-stack cell), which would fail every later test of the
cell, and with the compile store every later run; a failure every rank survived keeps the cache. The
runner's own records of the cell (its files) stay, and the failure still says a rank was interrupted."""

from __future__ import annotations

import pytest

from torchmatrix.matrix.cells import Cell
from torchmatrix.messages.compile_store import KNOWN_FAILURES
from torchmatrix.ranks.cell_ranks import Ranks
from torchmatrix.ranks.pool import RankFailure


class FailingPool:
    """A rank group whose every run fails as `failure` says."""

    world_size = 4

    def __init__(self, failure: RankFailure):
        self.failure = failure

    def run(self, fn, args, *, deadline, name):
        raise self.failure


def cache_with_a_truncated_kernel(tmp_path):
    kernel = tmp_path / "cell" / "rank2" / "53" / "kernel.main.so"
    kernel.parent.mkdir(parents=True)
    kernel.write_bytes(b"\x7fELF")
    (tmp_path / "cell" / "kernels" / "ab").mkdir(parents=True)
    (tmp_path / "cell" / KNOWN_FAILURES).write_text("{}")
    return tmp_path / "cell"


def only_the_runners_records_left(cache) -> bool:
    return sorted(path.name for path in cache.iterdir()) == [KNOWN_FAILURES]


def test_ranks_killed_at_the_deadline_leave_no_compile_cache(tmp_path):
    cache = cache_with_a_truncated_kernel(tmp_path)
    ranks = Ranks(
        FailingPool(RankFailure("rank 2 killed", "", timed_out=True)), Cell({"world_size": 4}), 600, str(cache)
    )
    with pytest.raises(RankFailure, match="deadline of 600s per test exceeded in cell ws4") as raised:
        ranks.run(print)
    assert only_the_runners_records_left(cache)
    assert raised.value.timed_out and raised.value.interrupted


def test_a_rank_that_died_or_was_killed_mid_test_leaves_no_compile_cache(tmp_path):
    cache = cache_with_a_truncated_kernel(tmp_path)
    died = RankFailure("rank 2 died (exit code -9)", "rank 2 died", interrupted=True)
    ranks = Ranks(FailingPool(died), Cell({"world_size": 4}), 600, str(cache))
    with pytest.raises(RankFailure, match="cell ws4: rank 2 died") as raised:
        ranks.run(print)
    assert only_the_runners_records_left(cache)
    assert raised.value.interrupted, "a known failure whose rank died is never remembered as one that raised"


def test_a_failure_the_ranks_survived_keeps_the_compile_cache(tmp_path):
    cache = cache_with_a_truncated_kernel(tmp_path)
    ranks = Ranks(
        FailingPool(RankFailure("ValueError: no", "ValueError: no")), Cell({"world_size": 4}), 600, str(cache)
    )
    with pytest.raises(RankFailure, match="cell ws4: ValueError") as raised:
        ranks.run(print)
    assert (cache / "rank2" / "53" / "kernel.main.so").exists()
    assert not raised.value.interrupted
