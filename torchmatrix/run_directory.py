"""Run directories: their names and the `latest` link (light enough for the noxfile to import)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def new_run_id() -> str:
    """Sortable and unique per process, so two runs started at once never share a directory."""
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def point_latest(reports: Path, run_id: str) -> None:
    """Atomically repoint reports/latest at a finished run."""
    link = reports / "latest"
    temporary = reports / f".latest-{os.getpid()}"
    if temporary.is_symlink():
        temporary.unlink()
    os.symlink(run_id, temporary)
    os.replace(temporary, link)
