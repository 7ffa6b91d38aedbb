"""`torchmatrix run`: run the selected cells of one torch version and write their reports.

Layout of a run directory (shared by every torch version of one nox invocation):

    reports/<run-id>/torch-<V>/<cell-id>.xml   one JUnit file per cell
    reports/<run-id>/torch-<V>/plan.json       what was planned: cells, filters, environment
    reports/<run-id>/torch-<V>/logs/           pytest logs, event logs and plans per group
    reports/<run-id>/junit.xml                 every cell of every version, merged
    reports/latest -> <run-id>
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from torchmatrix import junit
from torchmatrix.cells import Cell
from torchmatrix.component_check import check_components
from torchmatrix.config import Matrix
from torchmatrix.devices import Environment, ProbeError, probe
from torchmatrix.outcomes import OutcomeBook
from torchmatrix.plan import Group, SuiteRun, group_runs, plan_runs
from torchmatrix.progress import Progress
from torchmatrix.run_directory import point_latest
from torchmatrix.schedule import GroupProcess, Scheduler
from torchmatrix.selection import Shard, select_cells

INTERRUPTED_EXIT = 130
INSTALL_LOG_TAIL_LINES = 40


class RunError(Exception):
    """A problem that stops the run before any cell starts; the message says what to change."""


@dataclass
class RunRequest:
    """Everything `torchmatrix run` was asked to do."""

    matrix: Matrix
    version: str
    reports: Path
    run_id: str
    only: dict = field(default_factory=dict)
    keyword: str | None = None
    shard: Shard | None = None
    install_log: Path | None = None
    gpus_per_node: int | None = None
    multinode_launcher: str | None = None
    slots: int | None = None

    @property
    def run_dir(self) -> Path:
        return self.reports / self.run_id

    @property
    def version_dir(self) -> Path:
        return self.run_dir / f"torch-{self.version}"


def prepare_directory(path: Path) -> None:
    """Create `path` and prove it is writable, before any cell runs."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe_file = path / f".write-test-{os.getpid()}"
        probe_file.write_text("")
        probe_file.unlink()
    except OSError as error:
        raise RunError(
            f"cannot write reports to {path} ({error.strerror}); pass --reports DIR with a writable directory"
        ) from None


def run_version(request: RunRequest, stream=sys.stdout) -> int:
    """Run the cells of one torch version; return 0 (all passed or skipped), 1 (failures) or 130."""
    matrix = request.matrix
    cells = select_cells(matrix.cells(), only=request.only, keyword=request.keyword, shard=request.shard)
    with ThreadPoolExecutor(max_workers=2) as children:
        probed = children.submit(_probe_or_error) if request.install_log is None else None
        if request.install_log is None:
            _refuse_broken_components(matrix)
        prepare_directory(request.version_dir / "logs")
        runs = plan_runs(cells, matrix.suites)
        book = OutcomeBook(runs)
        progress = Progress(request.version, len(cells), stream)
        environment, runnable = _environment(request, book, probed.result() if probed else None)
    progress.say(
        f"torchmatrix: torch {request.version}, {len(cells)} cells, {len(runs)} suite runs, device: {environment['device']}"
    )
    interrupted = False
    if runnable:
        previous = {signum: signal.signal(signum, _interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            _run_cells(request, cells, runs, book, environment, progress)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
    _write_reports(request, cells, book, environment)
    totals = book.counts(cells)
    progress.say(
        f"torchmatrix: torch {request.version}: {totals['passed']} passed, {totals['failed']} failed, "
        f"{totals['error']} errors, {totals['skipped']} skipped; merged report: {request.run_dir / junit.MERGED_NAME}"
    )
    if interrupted:
        return INTERRUPTED_EXIT
    return 1 if totals["failed"] or totals["error"] else 0


def _refuse_broken_components(matrix: Matrix) -> None:
    """Stop before any cell runs when a component cannot be imported or called as the suites call it."""
    problems = check_components(matrix)
    if problems:
        raise RunError("\n".join(problems))


def _interrupt(signum, frame):
    """Ctrl-C and SIGTERM (a cancelled CI job) stop the run, and the reports are still written.

    Installed explicitly: a process started in the background by a non-interactive shell (or
    by a test runner) inherits SIGINT as ignored, and Ctrl-C would then do nothing.
    """
    raise KeyboardInterrupt


def _probe_or_error() -> Environment | ProbeError:
    """The torch probe, run beside the component check (each imports torch in a child)."""
    try:
        return probe()
    except ProbeError as error:
        return error


def _environment(request: RunRequest, book: OutcomeBook, probed: Environment | ProbeError | None) -> tuple[dict, bool]:
    """What the reports say about this environment's torch, and whether cells can run.

    When it is unusable, every planned run errors with the reason.
    """
    if probed is None:
        tail = _tail(request.install_log)
        _fail_all(book, f"torch=={request.version} failed to install (see {request.install_log})", tail)
        return {"device": "none (torch did not install)"}, False
    if isinstance(probed, ProbeError):
        _fail_all(book, str(probed), "")
        return {"device": "none (torch is not importable)"}, False
    environment = probed
    if request.version != "system" and environment.base_version != request.version:
        _fail_all(
            book,
            f"this environment has torch {environment.torch}, not {request.version}; rebuild the virtualenv (run nox without -R) or pass --torch system",
            "",
        )
        return environment.to_json(), False
    return environment.to_json(), True


def _fail_all(book: OutcomeBook, message: str, text: str) -> None:
    for key in book.runs:
        book.fail_run(key, "error", message, text)


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as error:
        return f"(cannot read {path}: {error.strerror})"
    return "\n".join(lines[-INSTALL_LOG_TAIL_LINES:])


def _run_cells(
    request: RunRequest,
    cells: list[Cell],
    runs: list[SuiteRun],
    book: OutcomeBook,
    environment: dict,
    progress: Progress,
) -> None:
    gpu_count = environment["gpu_count"] if environment["device_type"] == "cuda" else 0
    node_size = request.gpus_per_node or gpu_count or None
    runnable = []
    for run in runs:
        if node_size and run.cell.world_size > node_size and not request.multinode_launcher:
            book.fail_run(
                run.key,
                "skipped",
                f"needs {run.cell.world_size} GPUs; this node has {node_size} (pass --multinode-launcher to span nodes)",
            )
        else:
            runnable.append(run)
    cores = [] if gpu_count else sorted(os.sched_getaffinity(0))
    slots = request.slots or gpu_count or len(cores)
    groups = [
        _with_launcher(group, node_size, request.multinode_launcher)
        for group in group_runs(runnable, slots, fillers=not gpu_count)
    ]
    finished: set[Cell] = set()

    def report_finished_cells() -> None:
        for cell in cells:
            if cell not in finished and book.cell_done(cell):
                finished.add(cell)
                progress.cell_finished(cell.id, [o.status for _, o in book.for_cell(cell)], book.counts(finished))

    def start(group: Group) -> GroupProcess:
        return _start_group(request, group, environment)

    report_finished_cells()
    scheduler = Scheduler(
        groups,
        book,
        start=start,
        slots=slots,
        gpu_ids=list(range(gpu_count)),
        core_ids=cores,
        on_update=report_finished_cells,
    )
    scheduler.run()
    report_finished_cells()


def _with_launcher(group: Group, node_size: int | None, template: str | None) -> Group:
    """Give a group wider than one node its launch command, with {nnodes} and {nproc_per_node} filled in."""
    if not template or not node_size or group.world_size <= node_size:
        return group
    nnodes = -(-group.world_size // node_size)
    return replace(group, launcher=template.format(nnodes=nnodes, nproc_per_node=node_size))


def group_command(
    matrix: Matrix,
    version: str,
    group: Group,
    environment: dict,
    logs: Path,
    *,
    threads_per_rank: int = 1,
    gate: Path | None = None,
) -> list[str]:
    """Write the group's plan under `logs` and return the pytest command that runs it.

    A group with a launcher (torchrun, srun) is started through it, one pytest per rank. With a
    `gate`, the process imports and collects, then waits for the gate file before any test.
    """
    plan = logs / f"{group.name}.plan.json"
    suites = {run.suite.name: run.suite for run in group.runs}
    plan.write_text(
        json.dumps(
            {
                "torch": version,
                "world_size": group.world_size,
                "device": environment,
                "events": str(events_path(logs, group)),
                "threads_per_rank": 1,
                "gate": str(gate) if gate else None,
                "launcher": "external" if group.launcher else "pool",
                "components": matrix.components,
                "suites": {
                    name: {"path": s.path, "timeout": s.timeout, "options": s.options} for name, s in suites.items()
                },
                "runs": [{"suite": run.suite.name, "cell": run.cell.to_json()} for run in group.runs],
            },
            indent=2,
        )
    )
    python = shlex.split(group.launcher) if group.launcher else [sys.executable]
    return [
        *python, "-m", "pytest",
        "-p", "torchmatrix.plugin",
        "-p", "no:cacheprovider",
        "--torchmatrix-plan", str(plan),
        "--rootdir", str(matrix.root),
        "-q",
        "--tb=short",
        *sorted({s.path for s in suites.values()}),
    ]  # fmt: skip


def events_path(logs: Path, group: Group) -> Path:
    return logs / f"{group.name}.events.jsonl"


def _start_group(request: RunRequest, group: Group, environment: dict) -> GroupProcess:
    """Start `pytest -p torchmatrix.plugin` on the group's suites, waiting at its gate."""
    logs = request.version_dir / "logs"
    gate = logs / f"{group.name}.go"
    command = group_command(request.matrix, request.version, group, environment, logs, gate=gate)
    env = dict(os.environ)
    if group.launcher:
        env["TORCHMATRIX_DEVICE"] = environment["device_type"]
    return GroupProcess.start(
        group,
        command,
        cwd=request.matrix.root,
        env=env,
        log=logs / f"{group.name}.log",
        events=events_path(logs, group),
        gate=gate,
    )


def _write_reports(request: RunRequest, cells: list[Cell], book: OutcomeBook, environment: dict) -> None:
    for cell in cells:
        junit.write_cell(request.version_dir, request.version, environment, cell, book.for_cell(cell))
    (request.version_dir / "plan.json").write_text(
        json.dumps(
            {
                "torch": request.version,
                "matrix": str(request.matrix.path),
                "matrix_sha256": request.matrix.digest,
                "only": {axis: sorted(values) for axis, values in request.only.items()},
                "keyword": request.keyword,
                "shard": str(request.shard) if request.shard else None,
                "environment": environment,
                "cells": [cell.id for cell in cells],
                "pool_starts": book.pool_starts,
            },
            indent=2,
        )
    )
    junit.merge_run(request.run_dir)
    point_latest(request.reports, request.run_id)
