"""Checkpoints across the bump, per direction: can the candidate read the baseline's checkpoints
(forward) and can the baseline read the candidate's (rollback)?

Read from the cross_version suite's records: the writing version's write test and the reading
version's read test of each cell (torchmatrix/run/cross_version.py says where they run). A cell
whose read failed carries the failure's root cause; one with no write or no read is not checked,
with the reason, and never counts as passed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from torchmatrix.messages.cross_version import READ_TEST, SUITE
from torchmatrix.ranks.root_cause import group_key
from torchmatrix.reports.records import RunResults, TestRecord
from torchmatrix.status import Status

WRITE_TEST = "test_writes_checkpoint_for_other_versions"
NO_READ_PASS = (
    "not checked: torch {reader} never ran its read pass here (`python -m torchmatrix cross-read {run}` runs it)"
)
NO_WRITE = "not checked: torch {writer} wrote no checkpoint for this cell ({why})"


@dataclass(frozen=True)
class Direction:
    """One direction of one baseline/candidate pair: which cells' checkpoints loaded exactly,
    which failed (by root cause) and which were not checked (by reason)."""

    name: str
    writer: str
    reader: str
    passed: tuple[str, ...] = ()
    failed: dict[str, tuple[str, ...]] = field(default_factory=dict)
    not_checked: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def broken(self) -> bool:
        return bool(self.failed)

    @property
    def verdict(self) -> str:
        """The direction in one phrase: broken, exact, or not checked."""
        if self.failed:
            return f"checkpoints written by {self.writer} cannot be read by {self.reader}"
        if self.passed and not self.not_checked:
            return f"checkpoints written by {self.writer} load exactly under {self.reader}"
        if self.passed:
            return f"checkpoints written by {self.writer} load exactly under {self.reader} where checked"
        return f"not checked: no checkpoint written by {self.writer} was read by {self.reader}"

    def to_json(self) -> dict:
        return {
            "direction": self.name,
            "writer": self.writer,
            "reader": self.reader,
            "broken": self.broken,
            "passed": list(self.passed),
            "failed": [{"root_cause": cause, "cells": list(cells)} for cause, cells in self.failed.items()],
            "not_checked": [{"reason": reason, "cells": list(cells)} for reason, cells in self.not_checked.items()],
        }


def checkpoint_directions(results: RunResults, baseline: str, candidate: str) -> list[Direction]:
    """Rollback then forward for one pair; none when neither version ran the cross_version suite."""
    records = [r for r in results.tests if r.suite == SUITE and r.torch in (baseline, candidate)]
    if not records:
        return []
    return [
        _direction("rollback", candidate, baseline, records, results.run_id),
        _direction("forward", baseline, candidate, records, results.run_id),
    ]


def _direction(name: str, writer: str, reader: str, records: list[TestRecord], run_id: str) -> Direction:
    writes = {r.cell: r for r in records if r.torch == writer and r.test == WRITE_TEST}
    reads = {r.cell: r for r in records if r.torch == reader and r.test == f"{READ_TEST}[writer={writer}]"}
    cells = list(dict.fromkeys([*writes, *reads]))
    passed: list[str] = []
    failed: dict[str, list[str]] = defaultdict(list)
    not_checked: dict[str, list[str]] = defaultdict(list)
    for cell in cells:
        read, write = reads.get(cell), writes.get(cell)
        if read is not None and read.status is Status.PASSED:
            passed.append(cell)
        elif read is not None and read.status.is_failing:
            failed[group_key(read.message)].append(cell)
        elif write is None or write.status is not Status.PASSED:
            why = "it did not run this cell" if write is None else f"its write {write.status.value}: {write.message}"
            not_checked[NO_WRITE.format(writer=writer, why=why)].append(cell)
        elif read is None:
            not_checked[NO_READ_PASS.format(reader=reader, run=run_id)].append(cell)
        else:
            not_checked[read.message].append(cell)
    return Direction(
        name,
        writer,
        reader,
        tuple(passed),
        {cause: tuple(c) for cause, c in failed.items()},
        {reason: tuple(c) for reason, c in not_checked.items()},
    )
