"""The order a pytest process runs its suite runs in: the plan's, except that the cells about to compile
cold (with a backend the compile store keeps: Inductor, aot_eager) go first. Cold, they are a process's longest cells, and run last they would run
alone while the cores the other processes left sit idle; warm, they are short, and run last, nearly
alone, they use the fewest CPU seconds (docs/explanation/performance.md, the order's A/B)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.plan import run_key


def running_order(runs: Sequence[tuple[str, Cell]], compiles_cold: Callable[[Cell], bool]) -> dict[str, int]:
    """Each run key's place: the runs of cells `compiles_cold` names first, then the others, each part
    in plan order (a cell's runs all fall in one part)."""
    cold = {cell.id for cell in dict.fromkeys(cell for _, cell in runs) if compiles_cold(cell)}  # a cell once
    ordered = sorted(range(len(runs)), key=lambda index: (runs[index][1].id not in cold, index))
    return {run_key(runs[index][0], runs[index][1].id): place for place, index in enumerate(ordered)}
