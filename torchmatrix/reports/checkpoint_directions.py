"""Checkpoints across the bump, per direction: can the candidate read the baseline's checkpoints
(forward) and can the baseline read the candidate's (rollback)?

Read from the cross_version suite's records: the writing version's write test and the reading
version's read test of each cell (torchmatrix/run/cross_version.py says where they run). A cell
whose read failed carries the failure's root cause, whole, with the run directory's own paths made
relative to it; one with no write or no read is not checked, with the reason, and never counts as
passed. A direction belongs to the pair, and a break is the candidate's: its writer changed for a
rollback, its reader for a forward break.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from torchmatrix.json_records import JsonRecord, json_field
from torchmatrix.messages.cross_version import READ_TEST, SUITE
from torchmatrix.messages.root_cause import group_key
from torchmatrix.reports.records import RunResults, TestRecord
from torchmatrix.status import Status

WRITE_TEST = "test_writes_checkpoint_for_other_versions"
NO_READ_PASS = (
    "not checked: torch {reader} never ran its read pass here (`python -m torchmatrix cross-read {run}` runs it)"
)
NO_WRITE = "not checked: torch {writer} wrote no checkpoint for this cell ({why})"
ROLLBACK, FORWARD = "rollback", "forward"


def _listed(key: str, cells_by: dict[str, tuple[str, ...]]) -> list[dict]:
    """`{cause: cells}` as results.json lists it: `[{key: cause, "cells": [...]}]`."""
    return [{key: what, "cells": list(cells)} for what, cells in cells_by.items()]


@dataclass(frozen=True)
class Direction(JsonRecord):
    """One direction of one baseline/candidate pair: which cells' checkpoints loaded exactly,
    which failed (by root cause) and which were not checked (by reason)."""

    name: str = field(metadata=json_field(key="direction"))
    writer: str
    reader: str = field(
        metadata=json_field(
            then={"broken": lambda direction: direction.broken, "attributed_to": lambda direction: direction.candidate}
        )
    )
    passed: tuple[str, ...] = ()
    failed: dict[str, tuple[str, ...]] = field(
        default_factory=dict, metadata=json_field(dump=lambda failed: _listed("root_cause", failed))
    )
    not_checked: dict[str, tuple[str, ...]] = field(
        default_factory=dict, metadata=json_field(dump=lambda not_checked: _listed("reason", not_checked))
    )

    @property
    def broken(self) -> bool:
        return bool(self.failed)

    @property
    def candidate(self) -> str:
        """The version the direction's result is attributed to: the rollback's writer, the forward's reader."""
        return self.writer if self.name == ROLLBACK else self.reader

    @property
    def changed(self) -> str:
        """What of the candidate a break points at: `writer` or `reader`."""
        return "writer" if self.name == ROLLBACK else "reader"

    @property
    def label(self) -> str:
        """`rollback 2.15.0→2.13.0`: the column, row and totals name of the direction (writer → reader)."""
        return f"{self.name} {self.writer}→{self.reader}"

    @property
    def consequence(self) -> str:
        """What a break costs the release engineer, in one phrase."""
        if self.name == ROLLBACK:
            return f"rolling the pin back from {self.writer} to {self.reader} loses resume from {self.writer}'s checkpoints"
        return f"bumping the pin to {self.reader} loses resume from the checkpoints {self.writer} wrote"

    def status_of(self, cell: str) -> Status | None:
        """The cell's mark in the direction's grid column: failed, passed, skipped when not checked, None when absent."""
        if any(cell in cells for cells in self.failed.values()):
            return Status.FAILED
        if cell in self.passed:
            return Status.PASSED
        if any(cell in cells for cells in self.not_checked.values()):
            return Status.SKIPPED
        return None

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


def checkpoint_directions(results: RunResults, baseline: str, candidate: str) -> list[Direction]:
    """Rollback then forward for one pair; none when neither version ran the cross_version suite."""
    records = [r for r in results.tests if r.suite == SUITE and r.torch in (baseline, candidate)]
    if not records:
        return []
    return [
        _direction(ROLLBACK, candidate, baseline, records, results.run_id),
        _direction(FORWARD, baseline, candidate, records, results.run_id),
    ]


def direction_name(reader: str, baseline: str) -> str:
    """Which direction a read is: the baseline reading a candidate's checkpoint is the rollback."""
    return ROLLBACK if reader == baseline else FORWARD


def relative_to_run(text: str, run_id: str) -> str:
    """`text` with every absolute path into the run directory written relative to it
    (`/home/me/reports/<run>/torch-2.15.0/checkpoints/ws1` -> `torch-2.15.0/checkpoints/ws1`)."""
    if not run_id:
        return text
    return re.sub(r"(?:[A-Za-z]:)?(?:[/\\][^\s'\"/\\]+)*?[/\\]" + re.escape(run_id) + r"[/\\]", "", text)


def _direction(name: str, writer: str, reader: str, records: list[TestRecord], run_id: str) -> Direction:
    writes = {r.cell: r for r in records if r.torch == writer and r.test == WRITE_TEST}
    reads = {r.cell: r for r in records if r.torch == reader and r.test == f"{READ_TEST}[writer={writer}]"}
    cells = list(dict.fromkeys([*writes, *reads]))
    passed: list[str] = []
    causes: dict[str, str] = {}  # group key -> the first cause as shown
    failed: dict[str, list[str]] = defaultdict(list)
    not_checked: dict[str, list[str]] = defaultdict(list)
    for cell in cells:
        read, write = reads.get(cell), writes.get(cell)
        if read is not None and read.status is Status.PASSED:
            passed.append(cell)
        elif read is not None and read.status.is_failing:
            # the checkpoint's path names the cell that ran the read (a representative of others)
            cause = relative_to_run(read.message, run_id).replace(read.run_cell, "<cell>").replace(cell, "<cell>")
            failed[causes.setdefault(group_key(cause), cause)].append(cell)
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
