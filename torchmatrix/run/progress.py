"""Terminal progress: one line per finished cell with running totals, elapsed time and ETA.

Plain lines (no cursor tricks) so the same output reads well in a terminal and in a CI log.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TextIO

from torchmatrix.run.eta import WorkEstimate
from torchmatrix.status import Status, tally

FAILING_NAMED = 3
HEARTBEAT_S = 30.0
"""The longest the terminal goes without a line while cells run: a silent CI log reads as a hang."""


def format_seconds(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


@dataclass(frozen=True)
class InvocationPart:
    """This torch version's place among the versions one nox invocation runs, so the count and
    the ETA continue across them: part `index` of `count`, the invocation started at `since`
    (seconds since the epoch; None: now), and this version took `install_seconds` to install,
    which each version still to come is expected to take too."""

    index: int = 1
    count: int = 1
    since: float | None = None
    install_seconds: float = 0.0

    @property
    def versions_after(self) -> int:
        return self.count - self.index


class Progress:
    """Prints `[k/N] torch V cell-id: status | totals | elapsed, ETA` as cells finish.

    k, N and the elapsed time count every torch version of the invocation (`part`). The ETA
    rates only this runner's cells (installs and earlier versions are not cell work), then adds,
    for each version still to come, this version's install time and its wait for the first cell
    (process starts, imports). With an `estimate` (earlier runs' suite durations) it is the seed,
    and the observed rate counts from the first finished cell on: the process starts and imports
    before it are paid once.
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
        self.stream = stream
        self.estimate = estimate
        self.cells_left = total_cells * (part.count - part.index + 1)
        self.total = total_cells * part.count
        self.done = self.total - self.cells_left
        self.work_left = estimate.total * (part.count - part.index + 1) if estimate else 0.0
        self.done_here = 0
        self.work_rated = 0.0
        self.first_finished: float | None = None
        self.started_here = time.time()
        self.started = self.started_here if part.since is None else part.since
        self.part = part
        self.last_said = self.started_here
        self.last_eta: tuple[float, float] | None = None
        """When the last cell line was printed, and the ETA it gave."""

    def say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)
        self.last_said = time.time()

    def heartbeat(self, doing: str, now: float | None = None) -> None:
        """A line when none came for HEARTBEAT_S: what is `doing` (`5 cells to finish`), the cells
        done, the elapsed time, and the last cell line's ETA counted down since."""
        now = time.time() if now is None else now
        if now - self.last_said < HEARTBEAT_S:
            return
        eta = ""
        if self.last_eta is not None:
            said_at, seconds = self.last_eta
            eta = f", ETA {format_seconds(max(seconds - (now - said_at), 0.0))}"
        self.say(
            f"torchmatrix: torch {self.version}: {self.done}/{self.total} cells done, {doing}"
            f" | {format_seconds(now - self.started)} elapsed{eta}"
        )

    def cell_finished(self, cell_id: str, tests: list[tuple[str, Status]], totals: Mapping[Status, int]) -> None:
        """One line for a finished cell; ``tests`` is (test name, status) for each of its tests."""
        now = time.time()
        self.done, self.done_here, self.cells_left = self.done + 1, self.done_here + 1, self.cells_left - 1
        if self.estimate:
            work = self.estimate.per_cell.get(cell_id, 0.0)
            self.work_left -= work
            if self.first_finished is None:
                self.first_finished = now
            else:
                self.work_rated += work
            eta = self.estimate.remaining_seconds(now - self.first_finished, self.work_rated, self.work_left)
        else:
            eta = (now - self.started_here) / self.done_here * self.cells_left
        if self.first_finished is None:
            self.first_finished = now
        eta += self.part.versions_after * (self.part.install_seconds + self.first_finished - self.started_here)
        width = len(str(self.total))
        self.last_eta = (now, eta)
        self.say(
            f"[{self.done:>{width}}/{self.total}] torch {self.version} {cell_id}: {cell_outcome(tests)}"
            f" | {tally(totals)}"
            f" | {format_seconds(now - self.started)} elapsed, ETA {format_seconds(eta)}"
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
