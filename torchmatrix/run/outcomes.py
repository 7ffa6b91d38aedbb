"""What happened to every planned suite run, built from the event logs of the pytest processes.

Anything that did not report (a crashed or killed process, a collection error, a torch that did
not install) is filled in with an error or skip that says why, so no planned cell goes missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.plan import SuiteRun
from torchmatrix.messages.events import (
    Collected,
    CollectError,
    Event,
    PoolStarted,
    TestFinished,
    TestOutcome,
    TestStarted,
)
from torchmatrix.status import Status

NOTHING_COLLECTED = (
    "suite {suite} collected no test from {path}: pytest runs functions named test_* (in classes named Test*); "
    "check their names"
)


class OutcomeBook:
    """Collects test outcomes per suite run and answers for every planned cell."""

    def __init__(self, runs: Sequence[SuiteRun]):
        self.runs = {run.key: run for run in runs}
        self._runs_of_cell: dict[Cell, list[SuiteRun]] = {}
        for run in runs:
            for cell in dict.fromkeys(run.covers):
                self._runs_of_cell.setdefault(cell, []).append(run)
        self.expected: dict[str, list[str] | None] = {run.key: None for run in runs}
        self.tests: dict[str, list[TestOutcome]] = {run.key: [] for run in runs}
        self.closed: set[str] = set()
        self.uncollectable: set[str] = set()
        self.running: dict[str, tuple[str, float]] = {}
        self.first_started: dict[str, float] = {}
        self.pool_starts = 0

    def feed(self, event: Event, now: float) -> None:
        """Apply one event from a pytest process's log."""
        if isinstance(event, Collected):
            for key, names in event.runs.items():
                if key in self.expected and not names and not self.tests[key] and key not in self.closed:
                    suite = self.runs[key].suite
                    self.fail_run(key, Status.ERROR, NOTHING_COLLECTED.format(suite=suite.name, path=suite.path))
                elif key in self.expected:
                    self.expect(key, names)
        elif isinstance(event, TestStarted):
            self.running[event.key] = (event.test, now)
            self.first_started.setdefault(event.key, event.started)
        elif isinstance(event, TestFinished):
            self.running.pop(event.key, None)
            if event.key in self.tests:
                self.tests[event.key].append(event)
        elif isinstance(event, CollectError):
            for key, run in self.runs.items():
                if run.suite.name == event.suite and key not in self.closed:
                    self.uncollectable.add(key)
                    self.fail_run(key, Status.ERROR, f"suite {event.suite} could not be collected", event.text)
        elif isinstance(event, PoolStarted):
            self.pool_starts += 1

    def expect(self, key: str, names: Sequence[str]) -> None:
        """Name the tests a run would have had (as collection would), so failures list each one."""
        self.expected[key] = list(names)

    def fail_run(self, key: str, status: Status, message: str, text: str = "") -> None:
        """Give every test of the run without a result `status`; a never-collected run gets one case."""
        suite = self.runs[key].suite.name
        reported = {t.test for t in self.tests[key]}
        expected = self.expected[key]
        missing = [suite] if expected is None and not reported else [n for n in expected or [] if n not in reported]
        for name in missing:
            self.tests[key].append(TestOutcome(suite, name, status, message=message, text=text))
        self.closed.add(key)

    def close_group(self, keys: Sequence[str], message: str, text: str) -> None:
        """A process ended: its runs that are still incomplete get errors with the reason."""
        for key in keys:
            if not self.is_done(key):
                self.fail_run(key, Status.ERROR, message, text)
            self.closed.add(key)

    def fail_last_tests(self, keys: Sequence[str], message: str, text: str) -> None:
        """A process that reported every test but did not exit: the last test of each of its runs
        errors with the reason, unless it already failed (its failure stays the verdict)."""
        for key in keys:
            if self.tests[key] and not self.tests[key][-1].status.is_failing:
                self.tests[key][-1] = replace(self.tests[key][-1], status=Status.ERROR, message=message, text=text)

    def is_done(self, key: str) -> bool:
        if key in self.closed:
            return True
        expected = self.expected[key]
        return expected is not None and len(self.tests[key]) >= len(expected)

    def cell_runs(self, cell: Cell) -> list[SuiteRun]:
        return list(self._runs_of_cell.get(cell, ()))

    def cell_done(self, cell: Cell) -> bool:
        return all(self.is_done(run.key) for run in self.cell_runs(cell))

    def for_cell(self, cell: Cell) -> list[tuple[SuiteRun, TestOutcome]]:
        """Every test outcome that stands for this cell, with the run it came from."""
        return [(run, outcome) for run in self.cell_runs(cell) for outcome in self.tests[run.key]]

    def cell_started(self, cell: Cell) -> float | None:
        """Wall-clock time (epoch seconds) the cell's first own test started (else the first test of
        a run another cell ran for it), None if none did."""
        started = [run for run in self.cell_runs(cell) if run.key in self.first_started]
        own = [run for run in started if run.cell == cell] or started
        return min((self.first_started[run.key] for run in own), default=None)

    def counts(self, cells: Sequence[Cell]) -> dict[Status, int]:
        """Testcases per status over the cells, counted as the JUnit report shows them."""
        counts = dict.fromkeys(Status, 0)
        for cell in cells:
            for _, outcome in self.for_cell(cell):
                counts[outcome.status] += 1
        return counts
