"""What `torchmatrix run` was asked to do, and the torch version directory it claims.

Layout of a run directory (shared by every torch version of one nox invocation):

    reports/<run-id>/torch-<V>/<cell-id>.xml   one JUnit file per cell
    reports/<run-id>/torch-<V>/plan.json       what was planned: cells, filters, environment
    reports/<run-id>/torch-<V>/logs/           pytest logs, event logs and plans per group
    reports/<run-id>/torch-<V>/checkpoints/    what V wrote for the other versions to read (cross_version)
    reports/<run-id>/torch-<V>/reads/          V's reads of the other versions' checkpoints (cross-read)
    reports/<run-id>/junit.xml                 every cell of every version, merged
    reports/latest -> <run-id>
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.matrix.config import Matrix
from torchmatrix.matrix.selection import EVERY_CELL, CellSelection
from torchmatrix.matrix.suite_selection import SuiteSelection
from torchmatrix.messages.compile_store import CompileStore, matrix_digest
from torchmatrix.messages.cross_version import CHECKPOINTS_DIR, reads_dir
from torchmatrix.messages.output_cap import DEFAULT_CAP_BYTES
from torchmatrix.messages.run_lock import LOCK_NAME, RunBusy, lock_version_directory
from torchmatrix.messages.run_tree import ForeignEntry, refuse_linked_folders
from torchmatrix.run import compile_eviction, confirmation
from torchmatrix.run.progress import InvocationPart
from torchmatrix.user_error import UserError

DEFAULT_MAX_CPU_RANKS = 64  # each simulated rank is a process with torch loaded (~0.3 GB)


class RunError(UserError):
    """A problem that stops the run before any cell starts; the message says what to change."""


@dataclass
class RunRequest:
    """Everything `torchmatrix run` was asked to do."""

    matrix: Matrix
    version: str
    reports: Path
    run_id: str
    cell_selection: CellSelection = EVERY_CELL
    selection: SuiteSelection = SuiteSelection()
    install_log: Path | None = None
    gpus_per_node: int | None = None
    multinode_launcher: str | None = None
    slots: int | None = None
    confirm_limit: int = confirmation.DEFAULT_LIMIT
    restart: bool = False
    max_cpu_ranks: int = DEFAULT_MAX_CPU_RANKS
    output_cap: int = DEFAULT_CAP_BYTES
    part: InvocationPart = InvocationPart()
    cross_version_reads: bool = False
    peers: tuple[str, ...] | None = None
    """The versions cross_version pairs this run with, in place of matrix.toml's (bisect's steps
    name them); a read pass paired so reads the selected cells, having no run of its own."""
    compile_root: Path | None = None
    """The compile store every run of this torch build reuses (`--compile-cache`); None compiles
    cold, in the run's own directory (`--cold-compile`)."""
    compile_cap_bytes: int = int(compile_eviction.DEFAULT_CAP_GB * compile_eviction.GB)

    @property
    def compile_store(self) -> CompileStore | None:
        """What the group plans say of the store: its root and the matrix's part of its keys."""
        if self.compile_root is None:
            return None
        options = {name: suite.table for name, suite in self.matrix.suites.items()}
        return CompileStore(str(self.compile_root), matrix_digest(self.matrix.components, options))

    @property
    def run_dir(self) -> Path:
        return self.reports / self.run_id

    @property
    def version_dir(self) -> Path:
        """Where this run's cell reports, plan and logs go: the version's directory, or its reads/ for a read pass."""
        if self.cross_version_reads:
            return reads_dir(self.run_dir, self.version)
        return self.run_dir / f"torch-{self.version}"


def prepare_directory(
    path: Path, what: str = "reports", remedy: str = "pass --reports DIR with a writable directory"
) -> None:
    """Create `path` and prove it is writable, before any cell runs."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe_file = path / f".write-test-{os.getpid()}"
        file_writes.write_text(probe_file, "")
        probe_file.unlink()
    except OSError as error:
        raise RunError(f"cannot write {what} to {path} ({error.strerror}); {remedy}") from None


def claim_version_directory(request: RunRequest) -> None:
    """Refuse a torch version directory an earlier run with this id used (its events and gates
    would mix into this run), or with `restart`, clear it; a nox install log written for this run stays."""
    used = [
        path
        for path in [request.version_dir / "plan.json", *request.version_dir.glob("*.xml")]
        + sorted((request.version_dir / "logs").glob("*.events.jsonl"))
        if path.exists()
    ]
    if not used:
        return
    if not request.restart:
        raise RunError(
            f"{request.version_dir} already holds a run (found {used[0].name}); pass a new --run-id, or --restart to delete it and start clean"
        )
    keep = request.install_log.resolve() if request.install_log else None
    logs = request.version_dir / "logs"
    for path in [*request.version_dir.iterdir(), *(logs.iterdir() if logs.is_dir() else [])]:
        if path == logs or path.name == LOCK_NAME or path.resolve() == keep or not path.exists():
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def claim(request: RunRequest) -> int:
    """Lock the version directory against a second runner, refuse or clear an earlier run's files,
    and prove it writable; return the lock, held until the reports are written."""
    try:
        refuse_linked_folders(request.run_dir, _folders_written(request))
    except ForeignEntry as error:
        raise RunError(str(error)) from None
    try:
        lock = lock_version_directory(request.version_dir)
    except RunBusy as error:
        raise RunError(f"{error}; wait for it to finish, or pass another --run-id") from None
    except OSError as error:
        raise RunError(
            f"cannot write reports to {request.version_dir} ({error.strerror}); pass --reports DIR with a writable directory"
        ) from None
    try:
        claim_version_directory(request)
        prepare_directory(request.version_dir / "logs")
        if request.compile_root is not None:
            remedy = "pass --compile-cache DIR with a writable directory, or --cold-compile"
            prepare_directory(request.compile_root, "the compile cache", remedy)
    except BaseException:
        os.close(lock)
        raise
    return lock


def _folders_written(request: RunRequest) -> list[Path]:
    """The run directory's folders this run clears, writes or (a read pass) reads checkpoints from."""
    folders = [request.version_dir / "logs", request.run_dir / f"torch-{request.version}" / CHECKPOINTS_DIR]
    if request.cross_version_reads:
        folders += sorted(request.run_dir.glob(f"torch-*/{CHECKPOINTS_DIR}"))
    return folders
