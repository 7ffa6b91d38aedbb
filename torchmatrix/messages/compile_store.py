"""The compile cache that outlives a run: a folder per user (or per CI cache) where every run of a
torch build finds the graphs and kernels the runs before it compiled, held to a size cap.

Inside it, one folder per key (`torchmatrix.ranks.compile_keys`: the torch build, the compiler, the
sources and the matrix's components and suite options), and in that one folder per cell, whose ranks'
folders torch.compile caches into as in a run's own directory (`torchmatrix.run.compile_eviction`
holds the store to its size cap).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.json_records import JsonRecord

STORE_VARIABLE = "TORCHMATRIX_COMPILE_CACHE"
LAST_USED = "last-used"  # in a cell's folder: touched by each process that compiles into it


@dataclass(frozen=True)
class CompileStore(JsonRecord):
    """Where a run's processes cache what they compile: the store's root, and the digest of what the
    matrix says a graph depends on (its components and suites' options), part of every key."""

    root: str
    matrix_digest: str


def default_root() -> Path:
    """`$TORCHMATRIX_COMPILE_CACHE`, else `torchmatrix/compile-cache` in the user's cache directory."""
    if configured := os.environ.get(STORE_VARIABLE):
        return Path(configured)
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache_home) / "torchmatrix" / "compile-cache"


def matrix_digest(components: dict, suite_options: dict) -> str:
    """A digest of the components' import paths and every suite's options: a run with another model,
    dtype or step count never shares a key with this one; adding a cell or a version keeps it."""
    text = json.dumps({"components": components, "options": suite_options}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def mark_used(cell_folder: Path) -> None:
    """Mark a cell's folder used now (what eviction orders by)."""
    cell_folder.mkdir(parents=True, exist_ok=True)
    file_writes.write_text(cell_folder / LAST_USED, "")
