"""What each test compiled with a cold cache, kept in its cell's folder of the compile store, so that
a warm run can say how much compile time the store saved it (the summary's compile line)."""

from __future__ import annotations

import json
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.messages.compile_store import LEDGER


def has_compiled(cell_folder: Path) -> bool:
    """Whether a test of the cell has compiled into this folder before: its graphs are in the store."""
    return (cell_folder / LEDGER).is_file()


def compile_seconds_saved(cell_folder: Path, test: str, seconds: float) -> float | None:
    """The seconds `test` compiled for the first time this cell folder saw it, less `seconds` (what it
    compiled now), at least 0; None the first time, when `seconds` is recorded as its cold figure."""
    ledger = cell_folder / LEDGER
    try:
        cold = json.loads(ledger.read_text())
    except (OSError, ValueError):
        cold = {}
    if test in cold:
        return max(float(cold[test]) - seconds, 0.0)
    cold[test] = seconds
    try:
        file_writes.write_text(ledger, json.dumps(cold, sort_keys=True, indent=1))
    except OSError:
        pass  # a store that cannot be written only loses the figure, never the test
    return None
