"""The grid both summaries show: per cell, one mark per suite and torch version, and one per checkpoint direction.

A suite's mark is its worst status, order-dependent when its failures passed alone, partly skipped
when it passed with skips; summary.html links a failing mark to its failure's anchor.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchmatrix.reports.checkpoint_directions import Direction
from torchmatrix.reports.records import RunResults, TestRecord
from torchmatrix.status import NOT_RUN, ORDER_DEPENDENT, PARTLY_SKIPPED, Mark, Status

RecordKey = tuple[str, str, str, str]


@dataclass(frozen=True)
class GridMark:
    """One suite's (or direction's) mark in a grid cell; `link` is None for a mark that links nowhere."""

    mark: Mark
    title: str
    link: str | None = None


@dataclass(frozen=True)
class GridRow:
    """A cell's row: its axis values as the filters' indices, then its marks per torch version and per direction."""

    cell: str
    indices: str
    suites: list[list[GridMark]]
    directions: list[GridMark]


@dataclass(frozen=True)
class Grid:
    """The grid's axes (for the filters), column names and rows."""

    axes: list[tuple[str, list]]
    suites: list[str]
    versions: list[str]
    directions: list[str]
    rows: list[GridRow]


def record_key(record: TestRecord) -> RecordKey:
    """(torch, suite, test, run cell): which failure text, and so which anchor, a test's result is."""
    return (record.torch, record.suite, record.test, record.run_cell)


def grid(results: RunResults, directions: list[Direction], anchors: dict[RecordKey, str] | None = None) -> Grid:
    """Every cell of the run as a row; a failing suite's mark links to its first failure's entry in `anchors`."""
    anchors = anchors or {}
    axes = results.axes
    value_index = {axis: {value: i for i, value in enumerate(values)} for axis, values in axes.items()}
    statuses = results.statuses()
    order_dependent = results.order_dependent()
    partly_skipped = results.partly_skipped()
    first_failure = _first_failure_per_suite(results.tests)
    rows = []
    for cell, values in results.cells.items():
        marks = []
        for v in results.versions:
            cell_marks = []
            for suite in results.suites:
                key = (v.torch, cell, suite)
                status = statuses.get(key)
                if status is None:
                    cell_marks.append(GridMark(NOT_RUN, f"{suite}: not run"))
                    continue
                record = first_failure.get(key)
                mark, title, link = status.mark, f"{suite}: {status}", anchors.get(record_key(record)) if record else ""
                if key in order_dependent:
                    mark = ORDER_DEPENDENT
                elif key in partly_skipped:
                    skipped, tests = partly_skipped[key]
                    mark, title, link = (
                        PARTLY_SKIPPED,
                        f"{suite}: passed, {skipped} of {tests} tests skipped",
                        "skipped",
                    )
                cell_marks.append(GridMark(mark, title, link or ""))
            marks.append(cell_marks)
        rows.append(
            GridRow(
                cell,
                " ".join(str(value_index[axis].get(values.get(axis), -1)) for axis in axes),
                marks,
                [_direction_mark(direction, cell) for direction in directions],
            )
        )
    return Grid(
        list(axes.items()), results.suites, [v.torch for v in results.versions], [d.label for d in directions], rows
    )


def _direction_mark(direction: Direction, cell: str) -> GridMark:
    status = direction.status_of(cell)
    return GridMark(status.mark if status is not None else NOT_RUN, f"{direction.label}: {status or 'not run'}")


def _first_failure_per_suite(records: list[TestRecord]) -> dict[tuple[str, str, str], TestRecord]:
    """The test a suite's mark links to: its first failure, else its first CPU-simulation limit."""
    found: dict[tuple[str, str, str], TestRecord] = {}
    for record in sorted(records, key=lambda r: r.status is Status.SIMULATION_LIMIT):
        if record.status.is_failing or record.status is Status.SIMULATION_LIMIT:
            found.setdefault((record.torch, record.cell, record.suite), record)
    return found
