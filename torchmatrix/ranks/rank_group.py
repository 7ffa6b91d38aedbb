"""The one interface a suite process holds to its ranks, and the choice of implementation.

Ranks are either forked locally (RankPool, torchmatrix.ranks.pool) or started by an external launcher
with this process as one of them (LaunchedRank, torchmatrix.ranks.launched). The plugin holds only this
protocol, built from the group plan and the grant, and never asks which one it has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from torchmatrix.messages.grant import Grant
from torchmatrix.messages.group_plan import GroupPlan
from torchmatrix.ranks.launched import LaunchedRank
from torchmatrix.ranks.pool import RankPool, collective_timeout


class RankGroup(Protocol):
    """World-size ranks in one process group that run a function on every rank on demand."""

    world_size: int
    starts: int
    retired_cpu_seconds: float  # what ranks it has stopped used, so a test that failed them still counts it
    unread_ranks: int  # stopped ranks whose CPU could not be read (no /proc, or gone first)

    @property
    def running(self) -> bool:
        """Whether the ranks are up (a failed test takes a local pool down until the next start)."""

    def start(self) -> None:
        """Bring the ranks up if they are down; raise RankFailure saying why they cannot come up."""

    def run(self, fn, args: tuple, *, deadline: float, name: str | None = None) -> list:
        """fn(*args) on every rank, one result per rank in rank order, or RankFailure by `deadline`
        (naming `name`, the test's function a wrapper `fn` calls, else fn)."""

    def close(self, *, graceful: bool = True) -> None:
        """Stop the ranks and leave no process behind."""

    def of_size(self, world_size: int) -> RankGroup:
        """Ranks like these, `world_size` of them, in a process group of their own (started on their
        first run); RankFailure where these ranks cannot have one (a launcher fixed the world)."""

    def test_directory(self, own: Path, shared_root: Path, name: str) -> Path:
        """The directory a test's ranks write to: `own` when they share this machine, else a fresh
        one under `shared_root` that every rank sees."""


def open_ranks(plan: GroupPlan, grant: Grant) -> RankGroup:
    """The ranks for this group: this process as one launched rank, or a local pool pinned as granted."""
    timeout = collective_timeout(plan.deadline)
    if plan.launched:
        return LaunchedRank(plan.world_size, backend=plan.device.backend, collective_timeout_s=timeout)
    return RankPool(
        plan.world_size,
        device_type=plan.device.device_type,
        backend=plan.device.backend,
        collective_timeout_s=timeout,
        threads_per_rank=grant.threads_per_rank,
        cores=list(grant.cores),
    )
