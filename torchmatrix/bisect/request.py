"""What `torchmatrix bisect` was asked, and the one error it raises for what the user can change."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torchmatrix.matrix.config import Matrix
from torchmatrix.matrix.selection import EVERY_CELL, CellSelection
from torchmatrix.user_error import UserError


class BisectError(UserError):
    """Nothing to bisect, or a step the runner refused; the message says what to change."""


@dataclass
class BisectRequest:
    """What `torchmatrix bisect` was asked: pins and selection, or a run to take regressions from."""

    matrix: Matrix
    envdir: Path
    reports: Path
    good: str | None = None
    bad: str | None = None
    from_run: Path | None = None
    cell_selection: CellSelection = EVERY_CELL
    slots: int | None = None
