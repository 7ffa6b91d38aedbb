"""Terminal progress: one line per finished cell with running totals, elapsed time and ETA.

Plain lines (no cursor tricks) so the same output reads well in a terminal and in a CI log.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TextIO

from torchmatrix.eta import WorkEstimate
from torchmatrix.status import Status, tally

FAILING_NAMED = 3


def format_seconds(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


@dataclass(frozen=True)
class InvocationPart:
    """This torch version's place among the versions one nox invocation runs, so the count and
    the ETA continue across them: part `index` of `count`, the invocation started at `since`
    (seconds since the epoch; None: now)."""

    index: int = 1
    count: int = 1
    since: float | None = None


class Progress:
    """Prints `[k/N] torch V cell-id: status | totals | elapsed, ETA` as cells finish.

    k and N count the cells of every torch version of the invocation (`part`); the ETA comes
    from `estimate` (earlier runs' suite durations) when there is one, else from the rate so far.
    """

    def __init__(
        self,
        version: str,
        total_cells: int,
        stream: TextIO = sys.stdout,
        *,
        estimate: WorkEstimate | None = None,
        part: InvocationPart = InvocationPart(),
    ):
        self.version = version
        self.total = total_cells * part.count
        self.done = total_cells * (part.index - 1)
        self.stream = stream
        self.started = time.time() if part.since is None else part.since
        self.estimate = estimate
        self.work_total = estimate.total * part.count if estimate else 0.0
        self.work_done = estimate.total * (part.index - 1) if estimate else 0.0

    def say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def cell_finished(self, cell_id: str, tests: list[tuple[str, Status]], totals: Mapping[Status, int]) -> None:
        """One line for a finished cell; ``tests`` is (test name, status) for each of its tests."""
        self.done += 1
        elapsed = time.time() - self.started
        if self.estimate:
            self.work_done += self.estimate.per_cell.get(cell_id, 0.0)
            eta = self.estimate.remaining_seconds(elapsed, self.work_done, self.work_total)
        else:
            eta = elapsed / self.done * (self.total - self.done)
        width = len(str(self.total))
        self.say(
            f"[{self.done:>{width}}/{self.total}] torch {self.version} {cell_id}: {cell_outcome(tests)}"
            f" | {tally(totals)}"
            f" | {format_seconds(elapsed)} elapsed, ETA {format_seconds(eta)}"
        )


def cell_outcome(tests: list[tuple[str, Status]]) -> str:
    """`passed (19 tests, 13 skipped)`, or `failed (19 tests): test_a, test_b, test_c +2`: the worst
    status, how many tests, how many skipped, and the failing tests by name."""
    statuses = [status for _, status in tests]
    worst = Status.worst(statuses)
    skipped = statuses.count(Status.SKIPPED)
    counted = f"{len(tests)} tests" + (f", {skipped} skipped" if skipped and worst is not Status.SKIPPED else "")
    failing = [name for name, status in tests if status.is_failing]
    named = ", ".join(failing[:FAILING_NAMED]) + (
        f" +{len(failing) - FAILING_NAMED}" if len(failing) > FAILING_NAMED else ""
    )
    return f"{worst or 'no tests'} ({counted})" + (f": {named}" if failing else "")
