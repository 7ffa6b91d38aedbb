"""Confirmation re-runs a failure that follows from another failing test of its run in that test's
process (one shared experiment, not one per test); everything else, and a cycle, each alone."""

from __future__ import annotations

from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.config import Suite
from torchmatrix.matrix.plan import SuiteRun
from torchmatrix.messages.consequences import CONSEQUENCE_OF
from torchmatrix.messages.events import TestOutcome
from torchmatrix.reports.confirmation_notes import INTERRUPTED, why_not_rerun
from torchmatrix.run.confirmation import Retry, record, reruns
from torchmatrix.run.interrupts import STOPPED
from torchmatrix.run.outcomes import OutcomeBook
from torchmatrix.status import Confirmation

RESUME = Suite("resume", "suites/test_resume.py", 600.0, ("world_size",))
SCHEDULER = "test_state_restored_right_after_load[piece=scheduler]"
LOADER = "test_state_restored_right_after_load[piece=loader]"
LOSSES = "test_losses_identical_after_resume"
FINAL = "test_final_parameters_identical"


def retry(test: str, *follows: str, world_size: int = 2) -> Retry:
    cell = Cell({"world_size": world_size})
    properties = [[CONSEQUENCE_OF, ", ".join(follows)]] if follows else []
    return Retry(SuiteRun(RESUME, cell, (cell,)), TestOutcome("resume", test, "failed", properties=properties))


def processes_of(chosen):
    return [[r.outcome.test for r in process.retries] for process in reruns(chosen)]


def test_the_consequences_rerun_in_the_process_of_the_piece_they_follow_from():
    chosen = [retry(SCHEDULER), retry(LOADER), retry(LOSSES, SCHEDULER, LOADER), retry(FINAL, SCHEDULER, LOADER)]
    assert processes_of(chosen) == [[SCHEDULER, LOSSES, FINAL], [LOADER]]
    (first, _) = reruns(chosen)
    assert first.group(1).only_tests == tuple(f"resume::{test}" for test in (SCHEDULER, LOSSES, FINAL))


def test_a_consequence_whose_cause_passed_was_not_chosen_or_ran_in_another_cell_reruns_alone():
    chosen = [retry(SCHEDULER, world_size=1), retry(LOSSES, SCHEDULER), retry(FINAL, LOADER)]
    assert processes_of(chosen) == [[SCHEDULER], [LOSSES], [FINAL]]


def test_chains_join_the_first_cause_and_a_cycle_reruns_each_alone():
    assert processes_of([retry(SCHEDULER), retry(FINAL, LOSSES), retry(LOSSES, SCHEDULER)]) == [
        [SCHEDULER, LOSSES, FINAL]
    ]
    assert processes_of([retry(LOSSES, FINAL), retry(FINAL, LOSSES)]) == [[LOSSES], [FINAL]]


def test_a_rerun_the_run_was_stopped_before_says_so_and_one_that_reported_keeps_its_verdict():
    """Ctrl-C or SIGTERM during the re-runs alone: every failure still gets a note, and it is not
    'confirmation switched off'."""
    stopped, unstarted, finished = retry(FINAL), retry(SCHEDULER, world_size=1), retry(LOSSES, world_size=4)
    alone = [OutcomeBook([stopped.run]), OutcomeBook([unstarted.run]), OutcomeBook([finished.run])]
    alone[0].tests[stopped.run.key].append(TestOutcome("resume", FINAL, "error", message=STOPPED))
    alone[2].tests[finished.run.key].append(TestOutcome("resume", LOSSES, "failed", message="AssertionError: x"))
    record([stopped, unstarted, finished], alone, [], limit=10, unreported=INTERRUPTED)
    for cut_short in (stopped, unstarted):
        verdict = (cut_short.outcome.confirmation, cut_short.outcome.confirmation_note)
        assert verdict == (Confirmation.NOT_RERUN, INTERRUPTED), "stopped is not 'fails alone'"
        assert why_not_rerun(*verdict) == INTERRUPTED
    assert finished.outcome.confirmation == Confirmation.FAILS_ALONE
