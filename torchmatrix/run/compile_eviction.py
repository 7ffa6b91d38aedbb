"""The compile store's size cap: whole cell folders go, least recently used first, and never one a
run may be using."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from torchmatrix.env.install_progress import tree_bytes
from torchmatrix.messages.compile_store import LAST_USED

GB = 1 << 30
DEFAULT_CAP_GB = 8.0
RECENT_SECONDS = 3600.0  # a cell used this recently may be in use by another run: never evicted


@dataclass(frozen=True)
class Eviction:
    """What `evict` removed and what the store holds after it."""

    removed_cells: int
    removed_bytes: int
    kept_bytes: int


def evict(root: Path, cap_bytes: int, *, spare_since: float) -> Eviction:
    """Remove cell folders, least recently used first, until the store holds at most `cap_bytes`;
    a folder used since `spare_since` (this run's start) or within the last hour is kept whatever
    the cap, and a key folder left without cells goes with its last one."""
    cells = [cell for key in _folders(root) for cell in _folders(key)]
    sizes = {cell: tree_bytes(cell) for cell in cells}
    kept = sum(sizes.values())
    spare_after = min(spare_since, time.time() - RECENT_SECONDS)
    removed = removed_bytes = 0
    for cell in sorted(cells, key=_last_used):
        if kept <= cap_bytes:
            break
        if _last_used(cell) >= spare_after:
            continue
        shutil.rmtree(cell, ignore_errors=True)
        kept -= sizes[cell]
        removed, removed_bytes = removed + 1, removed_bytes + sizes[cell]
        if not _folders(cell.parent):
            shutil.rmtree(cell.parent, ignore_errors=True)
    return Eviction(removed, removed_bytes, kept)


def _folders(path: Path) -> list[Path]:
    """The sub-folders of `path` that are cells or keys (a dot-folder is the ISA probe's)."""
    try:
        return [entry for entry in path.iterdir() if entry.is_dir() and not entry.name.startswith(".")]
    except OSError:
        return []


def _last_used(cell: Path) -> float:
    for marker in (cell / LAST_USED, cell):
        try:
            return marker.stat().st_mtime
        except OSError:
            continue
    return 0.0
