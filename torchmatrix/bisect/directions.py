"""Checkpoint directions in a bisect: the broken ones a run or the pins' step shows, and what a
step that writes with one torch and reads with another judges.

A direction needs two versions, so its step writes the cell's cross_version checkpoint in one
release's venv and reads it in the other's, in one run directory (`torchmatrix run --peer`): for a
rollback each release writes and the baseline reads, for a forward break the baseline writes and
each release reads. The baseline's venv is installed once and reused by every step.
"""

from __future__ import annotations

from torchmatrix.bisect.regression import Regression
from torchmatrix.messages.cross_version import SUITE, writer_of_read
from torchmatrix.reports.checkpoint_directions import ROLLBACK, direction_name
from torchmatrix.reports.records import RunResults, TestRecord
from torchmatrix.status import Confirmation

WRITE_TEST = "test_writes_checkpoint_for_other_versions"


def broken_directions(results: RunResults, baseline: str) -> list[Regression]:
    """Each confirmed failed cross_version read of `results` between `baseline` and another version,
    as a search from the baseline (it passes: it reads its own checkpoints) to that version."""
    broken = []
    for record in results.tests:
        writer = writer_of_read(record.suite, record.test)
        if writer is None or not _confirmed_failure(record) or baseline not in (writer, record.torch):
            continue
        direction = direction_name(record.torch, baseline)
        candidate = writer if direction == ROLLBACK else record.torch
        axes = dict(results.cells.get(record.run_cell, {}))
        broken.append(
            Regression(SUITE, record.test, record.run_cell, axes, baseline, candidate, record.message, direction)
        )
    return broken


def _confirmed_failure(record: TestRecord) -> bool:
    return record.status.is_failing and record.confirmation == Confirmation.FAILS_ALONE and record.ran_in is None


def direction_step(regressions: list[Regression], version: str) -> list[tuple[str, str]]:
    """The (writer, reader) pairs a step on `version` runs for these directions of one cell."""
    return list(dict.fromkeys(regression.writer_and_reader(version) for regression in regressions))


def pins_step(good: str, bad: str) -> list[tuple[str, str]]:
    """Both directions between the pins: the good pin reads the bad pin's checkpoint (rollback),
    and the bad pin reads the good pin's (forward)."""
    return [(bad, good), (good, bad)]


def read_of(results: RunResults, regression: Regression, version: str) -> TestRecord | None:
    """The step's read this direction is judged by: its reader loading its writer's checkpoint, in the cell."""
    writer, reader = regression.writer_and_reader(version)
    return next(
        (
            record
            for record in results.tests
            if record.torch == reader
            and record.run_cell == regression.cell
            and writer_of_read(record.suite, record.test) == writer
        ),
        None,
    )


def write_failure(results: RunResults, regression: Regression, version: str) -> str:
    """Why the step's writer wrote no checkpoint for the cell (its write test's failure), or ""."""
    writer, _ = regression.writer_and_reader(version)
    failed = next(
        (
            record
            for record in results.tests
            if (record.torch, record.suite, record.test, record.run_cell)
            == (writer, SUITE, WRITE_TEST, regression.cell)
            and record.status.is_failing
        ),
        None,
    )
    return f"torch {writer} could not write the checkpoint: {failed.message}" if failed else ""
