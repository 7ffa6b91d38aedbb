"""The `compile` axis: the torch.compile backend a cell's model compiles its blocks with (`none`: eager),
read by the reference `parallelize` (models/block_compile.py) and by the runner, which prepares the
compiler for the ranks of a process whose cells compile (torchmatrix.ranks.compiler_warmup)."""

from __future__ import annotations

from collections.abc import Mapping

from torchmatrix.components.optimizer_implementations import COMPILED_STEP, implementation_of

COMPILE_AXIS = "compile"
NOT_COMPILED = "none"


def compiles(cell: Mapping[str, object]) -> bool:
    """Whether the cell runs torch.compile: its blocks (`compile`) or its optimizer's step (`optimizer_impl`)."""
    return str(cell.get(COMPILE_AXIS, NOT_COMPILED)) != NOT_COMPILED or implementation_of(cell) == COMPILED_STEP
