"""Which failures get a standalone reproducer, how they are named, and the command that writes
one: the summary pages print it for every confirmed failure, and `torchmatrix repro` reads the id."""

from __future__ import annotations

import shlex

from torchmatrix.reports.records import TestRecord
from torchmatrix.status import Confirmation


def failure_id(record: TestRecord) -> str:
    """`TORCH/CELL/SUITE::TEST`: a failure of one test, in the cell that ran it, on one torch."""
    return f"{record.torch}/{record.run_cell}/{record.suite}::{record.test}"


def is_reproducible(record: TestRecord) -> bool:
    """A failure that failed again alone, in the cell that ran it (not one of the cells it stands for)."""
    return record.status.is_failing and record.confirmation == Confirmation.FAILS_ALONE and record.ran_in is None


def repro_command(run_id: str, record: TestRecord) -> str:
    """The command that writes the reproducer of `record`, for a run under reports/, quoted for a
    POSIX shell (an id holding `'` or `$(...)` pastes as the one argument it is)."""
    return shlex.join(["torchmatrix", "repro", f"reports/{run_id}", failure_id(record)])
