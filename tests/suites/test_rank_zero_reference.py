"""parallel_equivalence computes its single-process reference on rank 0 and broadcasts it: every rank
gets rank 0's value, and an exception there reaches every rank instead of leaving them in the broadcast."""

from __future__ import annotations

import time

import pytest

from torchmatrix.ranks.pool import RankPool

from helpers import rank_functions as rf

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool():
    pool = RankPool(2, device_type="cpu", backend="gloo", collective_timeout_s=60)
    yield pool
    pool.close()


def test_every_rank_gets_rank_zeros_value(pool):
    results = pool.run(rf.rank_zero_broadcast, (False,), deadline=time.monotonic() + 60)
    assert results == [{"computed_on": 0}, {"computed_on": 0}]


def test_an_exception_on_rank_zero_reaches_every_rank(pool):
    results = pool.run(rf.rank_zero_broadcast, (True,), deadline=time.monotonic() + 60)
    assert results[0] == "ValueError: injected failure in the reference on rank 0"
    assert results[1] == (
        "RuntimeError: the single-process reference raised on rank 0, which computes it for every rank: "
        "ValueError: injected failure in the reference on rank 0"
    )
