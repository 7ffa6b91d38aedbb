"""Confirmation: every failed or errored test is re-run once alone, in a fresh pytest process.

- A test can fail because of what ran before it in the same process (state a suite cached, a rank
  pool an earlier test broke) rather than because of the torch under test. Re-run alone, it tells
  the two apart: "fails alone" is a behaviour of that torch; "passed alone" is order-dependent or
  flaky, and the upgrade diff does not count it as a regression or a fix.
- A failure that follows from another failing test of its run (messages.consequences) is re-run in
  that test's process, so an experiment the tests share (resume's training) runs once, not per test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from torchmatrix.matrix.plan import Group, SuiteRun
from torchmatrix.messages.consequences import CONSEQUENCE_OF, causes_named, under_their_causes
from torchmatrix.messages.events import TestOutcome
from torchmatrix.reports import confirmation_notes
from torchmatrix.run.eta import rerun_seconds
from torchmatrix.run.interrupts import STOPPED
from torchmatrix.run.outcomes import OutcomeBook
from torchmatrix.run.progress import Progress
from torchmatrix.run.schedule import Scheduler
from torchmatrix.status import Confirmation, Status, count

DEFAULT_LIMIT = 25
GROUP_PREFIX = "confirm"
"""How a confirmation process's group (its plan and event log) is named, so a rebuild can leave it out."""


@dataclass(frozen=True)
class Retry:
    """One failed test of one suite run, to re-run alone."""

    run: SuiteRun
    outcome: TestOutcome

    @property
    def follows_from(self) -> tuple[str, ...]:
        """The tests of its run whose failure this one's follows from (its CONSEQUENCE_OF property)."""
        value = next((value for name, value in self.outcome.properties if name == CONSEQUENCE_OF), None)
        return causes_named(value)


@dataclass(frozen=True)
class Rerun:
    """Failed tests of one suite run re-run together in a fresh process: one, and the failures that follow from it."""

    retries: tuple[Retry, ...]

    def group(self, index: int) -> Group:
        """A pytest process of its own, whose plan keeps only these tests of this run."""
        run = self.retries[0].run
        return Group(
            f"{GROUP_PREFIX}{index}-ws{run.cell.world_size}",
            run.cell.world_size,
            (run,),
            only_tests=tuple(f"{run.suite.name}::{retry.outcome.test}" for retry in self.retries),
        )


def reruns(chosen: Sequence[Retry]) -> list[Rerun]:
    """`chosen` in processes, in order: a retry that follows from another chosen failure of its run
    joins that one's process (through chains); the rest, and any left in a cycle, each get their own."""
    groups = under_their_causes(
        chosen,
        key=lambda retry: (retry.run.key, retry.outcome.test),
        causes=lambda retry: [(retry.run.key, test) for test in retry.follows_from],
    )
    return [Rerun((cause, *following)) for cause, following in groups]


class StartsProcesses(Protocol):
    """How the runner starts and waits for a list of groups (`Scheduler(...)` with its slots and launcher)."""

    def __call__(self, groups: list[Group], **options) -> Scheduler: ...


def confirm_failures(book: OutcomeBook, limit: int, scheduler: StartsProcesses, progress: Progress, slots: int) -> None:
    """Re-run each failed test of `book` alone in a fresh process (up to `limit`; one that follows from
    another in that one's), `slots` processes at a time, and mark it with what that showed."""
    found = retries(book) if limit > 0 else []
    if not found:
        return
    chosen, past_limit = found[:limit], found[limit:]
    processes = reruns(chosen)
    progress.reruns_begin(
        rerun_seconds(len(processes), sum(retry.outcome.duration for retry in chosen), progress.startup(), slots)
    )
    progress.say(
        f"torchmatrix: torch {progress.version}: re-running {len(chosen)} failed tests alone, "
        + (
            "each in a fresh process"
            if len(processes) == len(chosen)
            else f"in {count(len(processes), 'fresh process', 'fresh processes')} (a failure that follows from another runs with it)"
        )
        + (f" ({len(past_limit)} more past --confirm-limit {limit})" if past_limit else "")
        + f"; {progress.eta_text()}"
    )
    groups = [process.group(index) for index, process in enumerate(processes, 1)]
    books = [OutcomeBook(group.runs) for group in groups]
    in_process_order = [retry for process in processes for retry in process.retries]
    alone = [book for process, book in zip(processes, books) for _ in process.retries]
    try:
        scheduler(
            groups,
            book=None,
            books={g.name: b for g, b in zip(groups, books)},
            max_started=slots,
            on_update=lambda: progress.heartbeat(f"re-running {count(len(chosen), 'failed test')} alone"),
        ).run()
    except KeyboardInterrupt:
        record(in_process_order, alone, past_limit, limit, unreported=confirmation_notes.INTERRUPTED)
        raise
    progress.reruns_end()
    record(in_process_order, alone, past_limit, limit)
    book.pool_starts += sum(b.pool_starts for b in books)
    verdicts = [retry.outcome.confirmation for retry in in_process_order]
    progress.say(
        f"torchmatrix: torch {progress.version}: {verdicts.count(Confirmation.FAILS_ALONE)} of {len(chosen)} fail alone, "
        f"{verdicts.count(Confirmation.PASSED_ALONE)} passed alone (order-dependent or flaky)"
    )


def retries(book: OutcomeBook) -> list[Retry]:
    """The failed and errored tests worth re-running, in plan order: those of suite runs that were
    collected (a suite that could not be collected, or a process that died before collecting,
    would fail the same way), including tests that never got to run because an earlier one crashed."""
    return [
        Retry(book.runs[key], outcome)
        for key, outcomes in book.tests.items()
        if key not in book.uncollectable and book.expected[key] is not None
        for outcome in outcomes
        if outcome.status.is_failing
    ]


def record(
    chosen: Sequence[Retry],
    alone: Sequence[OutcomeBook],
    past_limit: Sequence[Retry],
    limit: int,
    unreported: str = confirmation_notes.REPORTED_NOTHING,
) -> None:
    """Mark each re-run test with what its run alone showed (`alone`: the books of the
    confirmation processes, in the order of `chosen`; `unreported`: the note of one whose process
    reported nothing, or that a signal stopped), and those past the limit as not re-run."""
    for retry, book in zip(chosen, alone):
        outcome = next((o for o in book.tests[retry.run.key] if o.test == retry.outcome.test), None)
        if outcome is not None and outcome.message == STOPPED:
            outcome = None  # stopped, not failed: no verdict
        _mark(retry.outcome, _verdict(outcome), _alone_text(outcome, unreported))
    for retry in past_limit:
        _mark(retry.outcome, Confirmation.NOT_RERUN, confirmation_notes.past_limit(limit))


def _mark(outcome: TestOutcome, verdict: Confirmation, note: str) -> None:
    outcome.confirmation = verdict
    outcome.confirmation_note = note


def _alone_text(outcome: TestOutcome | None, unreported: str) -> str:
    if outcome is None:
        return unreported
    if outcome.status.is_failing:
        return f"{outcome.status}: {outcome.message}"
    return f"{outcome.status}" + (f": {outcome.message}" if outcome.message else "")


def _verdict(outcome: TestOutcome | None) -> Confirmation:
    if outcome is None:
        return Confirmation.NOT_RERUN
    if outcome.status.is_failing:
        return Confirmation.FAILS_ALONE
    if outcome.status is Status.PASSED:
        return Confirmation.PASSED_ALONE
    return Confirmation.SKIPPED_ALONE
