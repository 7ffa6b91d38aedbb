"""One bisect search per distinct failure: the regressions of one root cause and direction between
the same pins share a search however many cells they broke, and each step checks every cell of it,
so seven cells broken the same way cost the steps of one. Where a step's cells disagree (some fail,
some pass), the search splits, each part going on from what was decided."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from torchmatrix.bisect.regression import Regression
from torchmatrix.bisect.search import Bisection, Outcome
from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.selection import CellSelection
from torchmatrix.messages.root_cause import group_key


@dataclass
class FailureSearch:
    """The regressions one search judges (one failure, in each of its cells) and its search state."""

    regressions: list[Regression]
    bisection: Bisection

    @property
    def cells(self) -> list[str]:
        return list(dict.fromkeys(regression.cell for regression in self.regressions))

    @property
    def direction(self) -> str | None:
        return self.regressions[0].direction

    @property
    def root_cause(self) -> str:
        return self.regressions[0].root_cause

    @property
    def name(self) -> str:
        """`s::t [ws1, ws2]`, one such part per test, or a direction's name over all its cells."""
        first = self.regressions[0]
        if first.direction:
            return first.named(self.cells)
        tests = dict.fromkeys((r.suite, r.test) for r in self.regressions)
        return "; ".join(
            next(r for r in self.regressions if (r.suite, r.test) == test).named(
                list(dict.fromkeys(r.cell for r in self.regressions if (r.suite, r.test) == test))
            )
            for test in tests
        )

    def record(self, version: str, verdicts: list[tuple[Outcome, str]]) -> list[FailureSearch]:
        """Record each cell's verdict on `version`; this search when they agree, else one search per
        outcome, each with its cells and a copy of what was decided before."""
        outcomes = dict.fromkeys(outcome for outcome, _ in verdicts)
        parts = []
        for outcome in outcomes:
            chosen = [(r, v) for r, v in zip(self.regressions, verdicts) if v[0] is outcome]
            part = self if len(outcomes) == 1 else FailureSearch([r for r, _ in chosen], copy.deepcopy(self.bisection))
            part.bisection.record(version, outcome, chosen[0][1][1])
            parts.append(part)
        return parts


def failure_key(regression: Regression) -> tuple:
    """What makes two regressions one failure: direction, pins and root cause, the cell's id blanked
    (a suite or checkpoint path names it) as the report groups root causes."""
    cause = regression.root_cause.replace(regression.cell, "<cell>")
    return regression.direction, regression.good, regression.bad, group_key(cause)


def grouped(regressions: list[Regression]) -> list[list[Regression]]:
    """The regressions grouped by failure, in the order each failure was first seen."""
    groups: dict[tuple, list[Regression]] = {}
    for regression in regressions:
        groups.setdefault(failure_key(regression), []).append(regression)
    return list(groups.values())


def cell_selection(regressions: list[Regression], matrix_cells: list[Cell]) -> list[str]:
    """`torchmatrix run` arguments for exactly the regressions' cells: `--only` for one cell, `-k`
    of their ids (the matrix's other ids containing one excluded) for several."""
    cells = list(dict.fromkeys(regression.cell for regression in regressions))
    if len(cells) == 1:
        return [f"--only={axis}={value}" for axis, value in regressions[0].axes.items()]
    chosen = [Cell(next(r.axes for r in regressions if r.cell == cell)) for cell in cells]
    return CellSelection.exactly(chosen, matrix_cells).arguments()
