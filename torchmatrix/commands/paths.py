"""The paths a command is given: each check written once, as one line that says what to pass, and
the default reports directory."""

from __future__ import annotations

from pathlib import Path

from torchmatrix.matrix.config import Matrix
from torchmatrix.run.run_request import RunError


def run_directory(path: Path, flag: str | None = None) -> Path:
    """`path`, refused in one line (naming `flag` when it came with one) unless it is a directory."""
    if not path.is_dir():
        named = f"{flag} {path}" if flag else str(path)
        raise RunError(f"{named} is not a run directory; pass one under reports/, e.g. reports/latest")
    return path


def reports_directory(reports: str | None, matrix: Matrix) -> Path:
    """Where run directories go: `--reports`, else reports/ next to matrix.toml."""
    return Path(reports).resolve() if reports else matrix.root / "reports"


def directory_to_write(path: Path, flag: str) -> Path:
    """`path` when it is a directory or can become one; a file there, or above it, is refused in one line."""
    existing = next(parent for parent in [path, *path.parents] if parent.exists())
    if not existing.is_dir():
        raise RunError(f"{flag} {path}: {existing} is a file, not a directory; pass a directory")
    return path


def write_failure(error: OSError) -> str:
    """What stopped a write, naming the file in the way (a rename names its target second)."""
    where = error.filename2 or error.filename
    if isinstance(error, IsADirectoryError):
        return f"{where} is a directory where a file goes; remove it, then run this again"
    return f"{error.strerror or error}: {where}" if where else str(error.strerror or error)
