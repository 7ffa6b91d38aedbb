"""What a generic mutant leaves as evidence, per cell: that it acted (it really broke something in
that cell), or why it cannot act there, so `sensitivity` calls a pass "missed" only where the bug was."""

from __future__ import annotations

import os
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.ranks.worker import current_cell_id

EVIDENCE_VARIABLE = "TORCHMATRIX_SENSITIVITY_EVIDENCE"
"""The folder where a mutant marks each cell it acted in (one empty file per cell id); the command sets it per mutant."""
_MARKED: set[str] = set()


def record_acted() -> None:
    """Mark that this mutant acted in the cell this rank runs now (once per cell and process)."""
    directory, cell = os.environ.get(EVIDENCE_VARIABLE), current_cell_id()
    if directory and cell and cell not in _MARKED:
        Path(directory).mkdir(parents=True, exist_ok=True)
        file_writes.write_text(Path(directory, cell), "")
        _MARKED.add(cell)


CANNOT_ACT = ".cannot-act"
"""The suffix of the evidence file in which a mutant says why it cannot act on a cell's stack."""


def record_cannot_act(reason: str) -> None:
    """Say why this mutant cannot act on the stack of the cell this rank runs (the stack lacks what it
    would break): the cell then reads n/a with `reason`, the component left as it is."""
    directory, cell = os.environ.get(EVIDENCE_VARIABLE), current_cell_id()
    if directory and cell:
        Path(directory).mkdir(parents=True, exist_ok=True)
        file_writes.write_text(Path(directory, cell + CANNOT_ACT), reason)


def cells_acted_in(directory: Path) -> set[str]:
    """The cells a mutant marked with `record_acted` in a run that used `directory` as its evidence folder."""
    if not directory.is_dir():
        return set()
    return {path.name for path in directory.iterdir() if not path.name.endswith(CANNOT_ACT)}


def reasons_it_cannot_act(directory: Path) -> dict[str, str]:
    """Per cell, why the mutant said (`record_cannot_act`) it cannot act there, in a run with this evidence folder."""
    if not directory.is_dir():
        return {}
    return {path.name.removesuffix(CANNOT_ACT): path.read_text() for path in directory.glob(f"*{CANNOT_ACT}")}
