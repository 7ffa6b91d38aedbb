"""Where torch.compile's caches live, both sides' one map of them: the store that outlives a run (a
folder per user or per CI cache, held to a size cap by run/compile_eviction) or, compiling cold, a
folder of the run's own.

    <store root>/                   default_root(), or --compile-cache DIR
      <key>/                        key_folder(): the torch build, compiler, sources, matrix digest
        key.json                    the facts that made the key's name, for a person to read
        .vec-isa-probe/             Inductor's ISA probe, built once for every cell of the key
        <cell id>/                  a cell's folder: every suite, test and re-run of the cell
          last-used                 what eviction orders by
          cold-compile-seconds.json what each test compiled cold (what a warm run saved)
          known-failures.json       the known failures that failed here (ranks/known_failure_memo)
          kernels/                  source-addressed builds the cell's ranks share
          rank<N>[-of-<W>]/         a rank's own FX graph and AOTAutograd caches
    reports/<run>/torch-<V>/compile-cache/   the same below it, for a run that compiles cold
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
RUN_FOLDER = "compile-cache"  # in a version's run directory, for a run that compiles cold
KEY_FACTS = "key.json"
PROBE_FOLDER = ".vec-isa-probe"  # a cell id starts with its world size, never a dot
KERNELS_FOLDER = "kernels"
LEDGER = "cold-compile-seconds.json"
KNOWN_FAILURES = "known-failures.json"
LAST_USED = "last-used"  # touched by each process that compiles into the cell's folder


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


def key_folder(root: Path, facts: dict) -> Path:
    """The folder of `root` named after `facts` (written beside its cells the first time)."""
    folder = key_folder_of(root, facts)
    record = folder / KEY_FACTS
    if not record.exists():
        folder.mkdir(parents=True, exist_ok=True)
        file_writes.write_text(record, json.dumps(facts, sort_keys=True, indent=1))
    return folder


def key_folder_of(root: Path, facts: dict) -> Path:
    """The name of `root`'s folder for `facts`, made or not."""
    return root / hashlib.sha256(json.dumps(facts, sort_keys=True, indent=1).encode()).hexdigest()[:20]


def cells_with_graphs(key: Path, cell_ids: list[str]) -> frozenset[str]:
    """Of `cell_ids`, those a test compiled into under the key folder `key` (their ledger): the cells
    whose graphs a run finds in the store."""
    return frozenset(cell for cell in cell_ids if (key / cell / LEDGER).is_file())


def run_folder(version_dir: Path) -> Path:
    """The folder a run that compiles cold caches into: every pytest process of the version's run,
    confirmation re-runs included, finds what the earlier ones compiled."""
    return version_dir / RUN_FOLDER


def rank_folder(cell_folder: str, rank: str, world: str = "") -> str:
    """A rank's own folder in its cell's; a rank of a world beside the cell's (`world` "-of-<size>")
    never shares rank N's of the cell."""
    return os.path.join(cell_folder, f"rank{rank}{world}")


def probe_folder(cell_folder: str | Path) -> str:
    """Where Inductor's ISA probe is built: beside the cells' folders, once for all of them."""
    return os.path.join(os.path.dirname(cell_folder), PROBE_FOLDER)


def kernels_folder(cell_folder: str) -> str:
    return os.path.join(cell_folder, KERNELS_FOLDER)
