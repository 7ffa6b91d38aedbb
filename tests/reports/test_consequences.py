"""A failure that follows from another failing test of its suite and cell (CONSEQUENCE_OF) is listed
under that test's root cause, not as a cause of its own; nothing is lost when the cause passed or
the chain loops."""

from __future__ import annotations

from torchmatrix.matrix.config import ReportSettings
from torchmatrix.messages.consequences import CONSEQUENCE_OF, consequence_of
from torchmatrix.reports import summary_html, summary_md
from torchmatrix.reports.closing import root_cause_lines
from torchmatrix.reports.records import RunResults, TestRecord, VersionInfo
from torchmatrix.status import Status

RESUME = "resume"
SCHEDULER = "test_state_restored_right_after_load[piece=scheduler]"
LOADER = "test_state_restored_right_after_load[piece=loader]"
LOSSES = "test_losses_identical_after_resume"
FINAL = "test_final_parameters_identical"


def record(test, message, *, cell="ws2-fsdp2", status=Status.FAILED, follows=()):
    figures = {CONSEQUENCE_OF: consequence_of(list(follows))} if follows else {}
    return TestRecord("2.13.0", cell, RESUME, test, status, 1.0, message, figures=figures)


def run_of(*records):
    """A run of one torch version and one cell holding `records`."""
    versions = [VersionInfo("2.13.0", planned_cells=("ws2-fsdp2",))]
    cells = {"ws2-fsdp2": {"world_size": "2", "fsdp": "fsdp2"}}
    return RunResults("r", "", [], "", "", "2.13.0", ReportSettings(), versions, cells, list(records))


def causes(*records):
    return run_of(*records).root_causes()


def lines(found):
    return {cause.line: sorted(r.test for r, _ in cause.consequences) for cause in found}


def test_downstream_failures_join_the_piece_the_load_left_behind():
    found = causes(
        record(SCHEDULER, "scheduler last_epoch is 0, saved 4"),
        record(LOADER, "loader would yield batch 0, saved at batch 4"),
        record(LOSSES, "loss at step 5 differs", follows=[SCHEDULER, LOADER]),
        record(FINAL, "final parameters differ", follows=[SCHEDULER, LOADER]),
    )
    assert lines(found) == {
        "scheduler last_epoch is 0, saved 4": [FINAL, LOSSES],
        "loader would yield batch 0, saved at batch 4": [],
    }
    assert sum(cause.tests for cause in found) == 4
    assert found[0].tests == 3


def test_a_consequence_whose_cause_passed_or_ran_in_another_cell_stands_as_its_own_cause():
    found = causes(
        record(SCHEDULER, "scheduler last_epoch is 0, saved 4", cell="ws1-none"),
        record(LOSSES, "loss at step 5 differs", follows=[SCHEDULER]),
        record(FINAL, "final parameters differ", follows=[LOADER]),
        record(LOADER, "", status=Status.PASSED),
    )
    assert lines(found) == {
        "scheduler last_epoch is 0, saved 4": [],
        "loss at step 5 differs": [],
        "final parameters differ": [],
    }


def test_chains_attach_to_the_first_cause_and_a_cycle_loses_nothing():
    chained = causes(
        record(SCHEDULER, "scheduler last_epoch is 0, saved 4"),
        record(LOSSES, "loss at step 5 differs", follows=[SCHEDULER]),
        record(FINAL, "final parameters differ", follows=[LOSSES]),
    )
    assert lines(chained) == {"scheduler last_epoch is 0, saved 4": [FINAL, LOSSES]}
    cycle = causes(
        record(LOSSES, "loss at step 5 differs", follows=[FINAL]),
        record(FINAL, "final parameters differ", follows=[LOSSES]),
    )
    assert sum(cause.tests for cause in cycle) == 2
    assert sorted(r.test for cause in cycle for r, _ in cause.failures + cause.consequences) == [FINAL, LOSSES]


def test_the_closing_lines_count_the_consequences_under_their_cause():
    run = run_of(
        record(SCHEDULER, "scheduler last_epoch is 0, saved 4"),
        record(LOSSES, "loss at step 5 differs", follows=[SCHEDULER]),
        record(FINAL, "final parameters differ", follows=[SCHEDULER]),
    )
    assert root_cause_lines(run) == [
        "torchmatrix: failures by root cause (1):",
        "  3 tests (2 following from it) in 1 cell, torch 2.13.0: scheduler last_epoch is 0, saved 4",
    ]


def test_both_summary_pages_list_the_consequences_under_their_cause():
    run = run_of(
        record(SCHEDULER, "scheduler last_epoch is 0, saved 4"),
        record(LOSSES, "loss at step 5 differs <b>", follows=[SCHEDULER]),
    )
    markdown = summary_md.render(run, [])
    assert (
        "- following from it, not causes of their own: `test_losses_identical_after_resume` in `ws2-fsdp2`" in markdown
    )
    page = summary_html.render(run, [])
    following = page[page.index("Following from it, not causes of their own:") :]
    assert "<code>test_losses_identical_after_resume</code> in <code>ws2-fsdp2</code>" in following
    assert "loss at step 5 differs &lt;b&gt;" in following
