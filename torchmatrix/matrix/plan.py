"""From selected cells to work: suite runs (one per distinct value of a suite's axes) and the
pytest process groups that run them (one per world size, so a rank pool serves many cells)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.config import Suite


def run_key(suite: str, cell_id: str) -> str:
    """Names one suite run for one (representative) cell."""
    return f"{suite}|{cell_id}"


@dataclass(frozen=True)
class SuiteRun:
    """A suite run for one representative cell; its result stands for every cell it covers."""

    suite: Suite
    cell: Cell
    covers: tuple[Cell, ...]

    @property
    def key(self) -> str:
        return run_key(self.suite.name, self.cell.id)


@dataclass(frozen=True)
class Group:
    """Suite runs of one world size, run by one pytest process with one rank pool.

    A group wider than one node has a `launcher` (e.g. `srun ... torchrun ...`) that starts
    pytest once per rank instead. `only_tests` (SUITE::TEST) narrows the suites it names to those
    tests: what `--test` asked for, or the one test a confirmation group re-runs.
    """

    name: str
    world_size: int
    runs: tuple[SuiteRun, ...]
    launcher: str | None = None
    only_tests: tuple[str, ...] = ()


def plan_runs(cells: Sequence[Cell], suites: Mapping[str, Suite]) -> list[SuiteRun]:
    """One run per suite per distinct combination of the axes the suite depends on.

    The first selected cell with a combination runs it; later cells with the same combination
    are covered by that run. World size is always part of the combination: it decides the pool.
    """
    runs = []
    for suite in suites.values():
        by_key: dict[tuple, list[Cell]] = {}
        for cell in cells:
            key = (cell.world_size,) + tuple(cell.get(axis) for axis in suite.axes)
            by_key.setdefault(key, []).append(cell)
        runs.extend(SuiteRun(suite, covered[0], tuple(covered)) for covered in by_key.values())
    return runs


def group_runs(runs: Sequence[SuiteRun], slots: int = 1, *, fillers: bool = False) -> list[Group]:
    """Group runs by world size, widest first; split a world size into as many groups as fit side by side.

    On 8 GPUs, world-size-1 runs are spread over 8 processes and world-size-4 runs over 2; each
    split keeps whole cells together so cells finish (and report) early. With `fillers` (CPU,
    where groups beyond the slots start at once on idle cycles instead of queueing), a world size
    splits only over the slots wider ones left: another filler process would only add a torch
    import (default matrix on 2 cores: 68 -> 60 s).
    """
    by_size: dict[int, list[SuiteRun]] = {}
    for run in runs:
        by_size.setdefault(run.cell.world_size, []).append(run)
    groups = []
    free = slots
    for size in sorted(by_size, reverse=True):
        position = {cell: i for i, cell in enumerate(dict.fromkeys(run.cell for run in by_size[size]))}
        cells = list(position)
        ordered = sorted(by_size[size], key=lambda run: position[run.cell])
        parts = max(1, min((free if fillers else slots) // size, len(cells)))
        free = max(0, free - parts * size)
        for index, part in enumerate(_split_by_cell(ordered, parts)):
            name = f"ws{size}" if parts == 1 else f"ws{size}-{index + 1}"
            groups.append(Group(name, size, tuple(part)))
    return groups


def _split_by_cell(runs: list[SuiteRun], parts: int) -> list[list[SuiteRun]]:
    """Contiguous slices with about the same number of runs, never splitting one cell's runs."""
    by_cell: dict[Cell, list[SuiteRun]] = {}
    for run in runs:
        by_cell.setdefault(run.cell, []).append(run)
    slices: list[list[SuiteRun]] = [[] for _ in range(parts)]
    placed = 0
    for cell_runs in by_cell.values():
        slices[min(parts - 1, placed * parts // len(runs))].extend(cell_runs)
        placed += len(cell_runs)
    return [s for s in slices if s]
