"""What a test holds to run functions on its cell's ranks: under the test's deadline, compiling into
the cell's own cache, and in a world of another size beside them."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from torchmatrix.components.compile_axis import aot_eager_alone
from torchmatrix.matrix.cells import Cell
from torchmatrix.ranks.pool import RankFailure
from torchmatrix.ranks.rank_group import RankGroup
from torchmatrix.ranks.worker import in_compile_cache


class Ranks:
    """What a test holds to run functions on every rank of its cell, under the test's deadline
    (which starts once the ranks are up), and on the ranks of a world of another size beside it."""

    def __init__(
        self,
        pool: RankGroup,
        cell: Cell,
        timeout: float,
        compile_cache: str,
        worlds: Callable[[int], RankGroup] | None = None,
    ):
        self.pool = pool
        self.cell = cell
        self.timeout = timeout
        self.compile_cache = compile_cache
        self.worlds = worlds
        self.world_size = pool.world_size
        self.deadline = time.monotonic() + timeout
        self.home = self
        self.world = ""

    def in_world(self, world_size: int) -> Ranks:
        """This test's ranks in a world of `world_size` of their own, whose default process group is
        exactly those ranks (the cell's own ranks at the cell's size), under the same deadline; for a
        stack that builds its mesh or saves over the whole default group. Skips the test, saying why,
        where no such world can be opened."""
        other, why_not = self.beside(world_size)
        if other is None:
            pytest.skip(why_not)
        return other

    def beside(self, world_size: int) -> tuple[Ranks | None, str]:
        """`in_world`'s ranks, or None and why no such world can be opened here (a launcher fixed the world)."""
        home = self.home
        if world_size == home.world_size:
            return home, ""
        if home.worlds is None:
            return None, f"these ranks cannot open a world of {world_size} of their own"
        try:
            pool = home.worlds(world_size)
        except RankFailure as failure:
            return None, str(failure)
        other = Ranks(pool, home.cell, home.timeout, home.compile_cache, home.worlds)
        other.deadline, other.home, other.world = home.deadline, home, f"-of-{world_size}"
        return other, ""

    def run(self, fn, *args) -> list:
        """fn(*args) on every rank, compiling into the cell's own cache; one result per rank, in rank order."""
        __tracebackhide__ = True
        try:
            return self.pool.run(
                in_compile_cache,
                (self.compile_cache, fn, args, self.world, aot_eager_alone(self.cell)),
                deadline=self.deadline,
                name=getattr(fn, "__qualname__", repr(fn)),
            )
        except RankFailure as failure:
            if failure.interrupted:  # a rank killed while Inductor wrote a kernel or graph leaves it half-written
                discard_compile_cache(self.compile_cache)
            if failure.timed_out:
                exceeded = f"deadline of {self.timeout:.0f}s per test exceeded"
                raise RankFailure(
                    f"{exceeded} in cell {self.cell.id}: {failure}", f"{exceeded}: {failure.root_cause}", timed_out=True
                ) from None
            raise RankFailure(
                f"cell {self.cell.id}: {failure}", failure.root_cause, interrupted=failure.interrupted
            ) from None


def discard_compile_cache(directory: str) -> None:
    """Remove a cell's compile cache after one of its ranks died or was killed mid-test (at the deadline,
    or when another rank failed): a rank killed while Inductor linked a kernel leaves a truncated .so
    there ("file too short"), which would fail every later test and run of the cell that compiles the
    same graph; the next compile starts cold instead. Its folders are what the ranks compiled (`kernels/`,
    `rank<N>/`); its files, the runner's own records of the cell (compile_store), stay."""
    for entry in Path(directory).glob("*/"):
        shutil.rmtree(entry, ignore_errors=True)
