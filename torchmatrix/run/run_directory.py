"""Run directories: their names and the `latest` link (light enough for the noxfile to import)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from torchmatrix.matrix.safe_names import UnsafeName, check_relative_path

# Names the reports directory uses for itself; a run directory called so would overwrite or loop.
RESERVED_NAMES = {
    "latest": "the link to the last finished run",
    "slurm": "where `torchmatrix slurm` writes its scripts",
    "slurm-logs": "where the Slurm jobs write their output",
}


def check_run_id(value: object, what: str) -> str:
    """`value` as a run directory under reports/: a relative path of plain names whose first is
    not one the reports directory uses for itself."""
    run_id = check_relative_path(value, what)
    first = run_id.split("/", 1)[0]
    if first in RESERVED_NAMES:
        raise UnsafeName(f"{what} {run_id!r}: reports/{first} is {RESERVED_NAMES[first]}; choose another run id")
    return run_id


def new_run_id() -> str:
    """Sortable and unique per process, so two runs started at once never share a directory."""
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def point_latest(reports: Path, run_id: str) -> bool:
    """Atomically repoint reports/latest at a finished run; False, touching nothing, where
    reports/latest is not a link (a directory someone put there, such as a downloaded artifact)."""
    link = reports / "latest"
    if link.exists() and not link.is_symlink():
        return False
    temporary = reports / f".latest-{os.getpid()}"
    if temporary.is_symlink():
        temporary.unlink()
    os.symlink(run_id, temporary)
    try:
        os.replace(temporary, link)
    except OSError:  # it became a directory since
        temporary.unlink()
        return False
    return True
