"""Terminal progress: one line per finished cell with running totals, elapsed time and ETA.

Plain lines (no cursor tricks) so the same output reads well in a terminal and in a CI log.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TextIO

from torchmatrix.run.eta import STARTUP_S, LaterPhases, WorkEstimate
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
    (seconds since the epoch; None: now), the versions after this one take `installs_after`
    seconds to install (estimated from their downloads; None: not estimated), and whether the
    report session (each version's read pass, then the reports) follows."""

    index: int = 1
    count: int = 1
    since: float | None = None
    installs_after: float | None = 0.0
    report_follows: bool = False

    @property
    def versions_after(self) -> int:
        return self.count - self.index


class Progress:
    """Prints `[k/N] torch V cell-id: status | totals | elapsed, ETA` as cells finish.

    k, N and the elapsed time count every torch version of the invocation (`part`). Once
    `seed`ed with a WorkEstimate (earlier runs' suite durations, else priors) the ETA is that
    work spread over the slots, rated by what is observed from the first finished cell on (the
    process starts and imports before it are paid once per runner), plus the phases after this
    version's cells (`LaterPhases`: installs, starts, read passes, report).
    """

    def __init__(
        self,
        version: str,
        total_cells: int,
        stream: TextIO = sys.stdout,
        *,
        part: InvocationPart = InvocationPart(),
        reading: bool = False,
    ):
        self.version = version
        self.subject = f"torch {version} reads" if reading else f"torch {version}"
        """What each cell line says ran: a read pass's lines say so, so its count is not taken for the matrix's."""
        self.stream = stream
        self.estimate: WorkEstimate | None = None
        self.later = LaterPhases()
        self.cells_left = total_cells * (part.count - part.index + 1)
        self.total = total_cells * part.count
        self.done = self.total - self.cells_left
        self.work_left = 0.0
        self.done_here = 0
        self.work_rated = 0.0
        self.first_finished: float | None = None
        self.started_here = time.time()
        self.started = self.started_here if part.since is None else part.since
        self.part = part
        self.last_said = self.started_here
        self.last_eta: tuple[float, float] | None = None
        """When the last ETA was printed, and the seconds it gave."""
        self.reruns_until: float | None = None
        """When the failed tests' re-runs alone should end, while they run."""

    def seed(self, estimate: WorkEstimate, later: LaterPhases) -> None:
        """Estimate from here on: `estimate` is this version's cell work (each later version's the
        same), `later` what follows the cells."""
        self.estimate, self.later = estimate, later
        self.work_left = estimate.total * (self.part.count - self.part.index + 1)

    def say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)
        self.last_said = time.time()

    def eta_text(self, now: float | None = None) -> str:
        """`ETA 12:30` for the time left (remembered, so the heartbeat counts it down), `ETA
        unknown` before anything can say; installs not estimated are named, never guessed."""
        now = time.time() if now is None else now
        seconds = self._remaining(now)
        if seconds is None:
            return "ETA unknown"
        self.last_eta = (now, seconds)
        unestimated = self.later.installs is None and self.later.versions
        return f"ETA {format_seconds(seconds)}" + (" + installs not estimated" if unestimated else "")

    def startup(self) -> float:
        """Seconds a runner's processes take before their first cell: this runner's, once observed."""
        if self.first_finished is not None:
            return self.first_finished - self.started_here
        return STARTUP_S * (self.estimate.contention if self.estimate is not None else 1.0)

    def reruns_begin(self, seconds: float, now: float | None = None) -> None:
        """The failed tests' re-runs alone start and should take `seconds`: the ETA counts them until `reruns_end`."""
        self.reruns_until = (time.time() if now is None else now) + seconds

    def reruns_end(self) -> None:
        self.reruns_until = None

    def _remaining(self, now: float) -> float | None:
        """Seconds left for this version's cells, its re-runs and everything after them; None without
        an estimate or a finished cell."""
        reruns = max(self.reruns_until - now, 0.0) if self.reruns_until is not None else 0.0
        cells_and_after = self._cells_and_after(now)
        return None if cells_and_after is None else reruns + cells_and_after

    def _cells_and_after(self, now: float) -> float | None:
        """Seconds left for this version's cells (seeded, then rated as observed) and the phases after them."""
        contention = self.estimate.contention if self.estimate is not None else 1.0
        startup = self.startup()
        if self.estimate is not None:
            if self.first_finished is None:
                waiting = max(startup - (now - self.started_here), 0.0)
                cells = waiting + self.estimate.remaining_seconds(0.0, 0.0, self.work_left)
            else:
                cells = self.estimate.remaining_seconds(now - self.first_finished, self.work_rated, self.work_left)
            return cells + self.later.seconds(startup, self.estimate.slots, contention)
        if not self.done_here:
            return None
        return (now - self.started_here) / self.done_here * self.cells_left + self.later.seconds(startup, 1)

    def heartbeat(self, doing: str, now: float | None = None) -> None:
        """A line when none came for HEARTBEAT_S: what is `doing` (`5 cells to finish`), the cells
        done, the elapsed time, and the last ETA counted down since; once that reaches zero with
        work left, the ETA is unknown and the line says by how much the estimate is passed."""
        now = time.time() if now is None else now
        if now - self.last_said < HEARTBEAT_S:
            return
        eta = ""
        if self.last_eta is not None:
            said_at, seconds = self.last_eta
            left = seconds - (now - said_at)
            eta = (
                f", ETA {format_seconds(left)}"
                if left > 0
                else f", ETA unknown ({format_seconds(-left)} past the estimate)"
            )
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
            if self.first_finished is not None:
                self.work_rated += work
        if self.first_finished is None:
            self.first_finished = now
        width = len(str(self.total))
        self.say(
            f"[{self.done:>{width}}/{self.total}] {self.subject} {cell_id}: {cell_outcome(tests)}"
            f" | {tally(totals)}"
            f" | {format_seconds(now - self.started)} elapsed, {self.eta_text(now)}"
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
