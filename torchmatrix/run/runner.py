"""`torchmatrix run`: run the selected cells of one torch version and write their reports (the
request and its directory are `run_request`'s, the pytest command line `pytest_command`'s)."""

from __future__ import annotations

import dataclasses
import errno
import os
import shlex
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from torchmatrix.env.devices import Environment, ProbeError
from torchmatrix.exit_codes import ExitCode
from torchmatrix.forks.leftover_processes import adopt_orphans, kill_leftovers
from torchmatrix.forks.preloaded_forks import PreloadedForks
from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.plan import Group, SuiteRun, group_runs, plan_runs
from torchmatrix.matrix.safe_names import UnsafeName, check_name
from torchmatrix.messages import compile_keys, compile_store
from torchmatrix.messages.run_plan import PlanFileError, PlannedSuite, RunPlan, read_plan, write_plan
from torchmatrix.reports import junit
from torchmatrix.run import compile_eviction, confirmation, cross_version
from torchmatrix.run.component_check import ComponentCheck, check_components
from torchmatrix.run.eta import LaterPhases, WorkEstimate, contention, suite_history
from torchmatrix.run.interrupts import STOPPED, Interrupts
from torchmatrix.run.load_sampler import LoadSampler
from torchmatrix.run.outcomes import OutcomeBook
from torchmatrix.run.progress import Progress
from torchmatrix.run.pytest_command import start_group, suite_environment, with_launcher
from torchmatrix.run.run_directory import point_latest
from torchmatrix.run.run_request import RunError, RunRequest, claim
from torchmatrix.run.schedule import Scheduler
from torchmatrix.status import Status, count, tally

INSTALL_LOG_TAIL_LINES = 40


def run_version(request: RunRequest, stream=sys.stdout) -> ExitCode:
    """Run the cells of one torch version; return PASSED (all passed or skipped), FAILED or INTERRUPTED.

    Whatever stops it (Ctrl-C, SIGTERM, a full disk), every planned cell is in the reports, and no
    process it started outlives it."""
    adopt_orphans()
    with Interrupts() as interrupts:
        try:
            return _run_version(request, stream, interrupts)
        finally:
            interrupts.writing_reports()  # a signal during the sweep below only says so
            kill_leftovers()


def _run_version(request: RunRequest, stream, interrupts: Interrupts) -> ExitCode:
    matrix = request.matrix
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    started_at = time.time()
    cells = _cells(request)
    suites = request.selection.choose(
        cross_version.suites_for(
            matrix, request.version, request.run_dir, reads=request.cross_version_reads, paired=request.peers
        ),
        matrix.root,
    )
    runs = plan_runs(cells, suites)
    book = OutcomeBook(runs)
    environment = Environment.without_torch("none (interrupted before the torch probe finished)")
    progress = Progress(request.version, len(cells), stream, part=request.part, reading=request.cross_version_reads)
    lock = None
    stopped = None
    forks = PreloadedForks(request.version_dir / "logs" / "preloaded-forks.log")
    if request.install_log is None:  # else no request comes; started before the load sampler's thread
        forks.prepare(request.matrix.root, suite_environment(request))
    load = LoadSampler().start()
    try:
        check = _check_and_probe(request, forks, suites)
        lock = claim(request)
        environment, runnable = _environment(request, book, check.environment if check else None)
        eta = ""
        if runnable:
            estimate = _work_estimate(request, runs, environment, check.build if check else None)
            progress.seed(estimate, _later_phases(request, cells, suites, environment))
            source = "the last runs here" if estimate.from_history else "per-suite priors, no earlier run here"
            eta = f"; {progress.eta_text()} ({source})"
            _refuse_too_wide_for_cpu(request, cells, environment)
        _write_plan(request, cells, book, environment, started, finished=False)
        progress.say(
            f"torchmatrix: {progress.subject} the other versions' checkpoints, {len(cells)} cells, device: {environment.description}{eta}"
            if request.cross_version_reads
            else f"torchmatrix: torch {request.version}, {len(cells)} cells, {len(runs)} suite runs, device: {environment.description}{eta}"
        )
        if runnable:
            _run_cells(request, cells, runs, book, environment, progress, forks)
        interrupts.writing_reports()
    except KeyboardInterrupt:
        interrupts.writing_reports()
        stopped = STOPPED
    except OSError as error:
        interrupts.writing_reports()
        stopped = f"the runner could not write to {request.run_dir} ({_os_error(error)})"
    except BaseException:  # a refusal (RunError) after the claim: nothing to report, the lock goes
        if lock is not None:
            os.close(lock)
        raise
    finally:
        forks.close()
    try:
        if lock is None:
            lock = claim(request)
        if stopped:
            _fail_unfinished(book, stopped)
        _write_reports(request, cells, book, environment, started, load.stop())
        _hold_compile_store_to_cap(request, progress, started_at)
    except OSError as error:
        raise RunError(
            f"cannot write the reports of torch {request.version} to {request.version_dir} ({_os_error(error)}); "
            f"the reports of finished cells are kept: make room, then rebuild the rest with `python -m torchmatrix report {shlex.quote(str(request.run_dir))}`"
        ) from None
    finally:
        if lock is not None:
            os.close(lock)
    totals = book.counts(cells)
    merged = request.run_dir / junit.MERGED_NAME
    progress.say(
        f"torchmatrix: {progress.subject}: {tally(totals)}; added to {merged}"
        if request.cross_version_reads
        else f"torchmatrix: torch {request.version}: {tally(totals)}; merged report: {merged}"
    )
    if interrupts.interrupted:
        return ExitCode.INTERRUPTED
    if stopped:
        raise RunError(f"torch {request.version}: {stopped}; every cell it did not finish errors saying so")
    return ExitCode.FAILED if any(count for status, count in totals.items() if status.is_failing) else ExitCode.PASSED


def _hold_compile_store_to_cap(request: RunRequest, progress: Progress, started_at: float) -> None:
    """Evict the compile store's least recently used cells beyond its cap, saying so when any went."""
    if request.compile_root is None:
        return
    evicted = compile_eviction.evict(request.compile_root, request.compile_cap_bytes, spare_since=started_at)
    if evicted.removed_cells:
        progress.say(
            f"torchmatrix: compile cache {request.compile_root}: removed the {count(evicted.removed_cells, 'cell')} "
            f"used longest ago ({evicted.removed_bytes / compile_eviction.GB:.1f} GB), {evicted.kept_bytes / compile_eviction.GB:.1f} GB kept "
            f"(cap {request.compile_cap_bytes / compile_eviction.GB:.1f} GB: --compile-cache-size)"
        )


def _check_and_probe(request: RunRequest, forks: PreloadedForks, suites: dict) -> ComponentCheck | None:
    """The component check, whose child answers the torch probe and the compile key's build facts too,
    forked from the run's preloaded interpreter in the suites' environment, so the pytest processes fork
    from the same one; None when nox's install of this torch version failed (its log says why)."""
    if request.install_log is not None:
        return None
    return _refuse_broken_components(request, forks, suites)


def _os_error(error: OSError) -> str:
    """An OSError in words, naming a full disk as such."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{error.strerror}: the disk is full"
    return f"{error.strerror}: {error.filename}" if error.filename else str(error.strerror or error)


def _fail_unfinished(book: OutcomeBook, message: str) -> None:
    for key in book.runs:
        if not book.is_done(key):
            book.fail_run(key, Status.ERROR, message)


def _cells(request: RunRequest) -> list[Cell]:
    """The selected cells; a read pass reads for exactly the cells its version's run planned (one
    paired by --peer, for the selected cells: it has no run of its own)."""
    if not request.cross_version_reads or request.peers is not None:
        return request.matrix.select(request.cell_selection)
    plan = request.run_dir / f"torch-{request.version}" / "plan.json"
    try:
        return [_checked(Cell(axes)) for axes in read_plan(plan).cell_axes]
    except PlanFileError as error:
        raise RunError(f"{error}; a read pass needs the version's own run first") from None
    except UnsafeName as error:
        raise RunError(f"{plan}: {error}; refusing to use it") from None


def _checked(cell: Cell) -> Cell:
    """`cell`, whose id (read from another machine's plan.json) becomes a file name."""
    check_name(cell.id, "cell id")
    return cell


def _slots(request: RunRequest, environment: Environment) -> int:
    """How many ranks may run at once: --slots, else the GPUs, else the cores this process may use."""
    return request.slots or environment.gpu_count or len(os.sched_getaffinity(0))


def _work_estimate(
    request: RunRequest, runs: list[SuiteRun], environment: Environment, build: dict | None
) -> WorkEstimate:
    """The ETA's seed: what the planned suite runs took in earlier runs under --reports, with the
    compile store as it stands for each cell now, else the priors, at the contention the machine's load says now."""
    slots = _slots(request, environment)
    history = suite_history(request.reports, request.version, request.run_id, None if environment.gpu_count else slots)
    busy = contention(os.getloadavg()[0], len(os.sched_getaffinity(0)))
    store, warm = request.compile_store, frozenset()
    if store is not None and build is not None:  # the folder the ranks will compile into
        key = compile_keys.key_of(build, environment.to_json(), store.matrix_digest)
        warm = compile_store.cells_with_graphs(
            compile_store.key_folder_of(Path(store.root), key), [r.cell.id for r in runs]
        )
    return WorkEstimate.of_runs(runs, history.per_suite, slots, busy, per_run=history.per_run, warm_cells=warm)


def _later_phases(request: RunRequest, cells: list[Cell], suites: dict, environment: Environment) -> LaterPhases:
    """What the invocation runs after this version's cells: the later versions' installs and
    starts, then, when the report session follows, each version's read pass (a run with the
    cross_version suite) and the report."""
    part = request.part
    if request.cross_version_reads:
        return LaterPhases()
    reads = part.count if part.report_follows and cross_version.SUITE in suites else 0
    return LaterPhases(
        part.versions_after,
        part.installs_after,
        reads,
        len(cells),
        part.report_follows,
        reads_side_by_side=bool(environment.gpu_count),
    )


def _refuse_too_wide_for_cpu(request: RunRequest, cells: list[Cell], environment: Environment) -> None:
    """On CPU every rank is a process: a world size of thousands would fork until the machine
    gives out, so cells wider than `--max-cpu-ranks` stop the run before it starts."""
    if environment.device_type != "cpu" or request.multinode_launcher:
        return
    widest = max((cell.world_size for cell in cells), default=0)
    if widest > request.max_cpu_ranks:
        raise RunError(
            f"world size {widest} needs {widest} rank processes on this CPU-only machine, above the limit of {request.max_cpu_ranks}; "
            f"narrow the selection (--only world_size=...) or pass --max-cpu-ranks {widest}"
        )


def _refuse_broken_components(request: RunRequest, forks: PreloadedForks, suites: dict) -> ComponentCheck:
    """Stop before any cell runs when a component cannot be imported or called as the suites call
    it; warn about each component whose package this environment lacks; return what the check's
    child found."""
    check = check_components(
        request.matrix,
        request.version,
        env=suite_environment(request),
        forks=forks,
        suite_files=[request.matrix.root / suite.path for suite in suites.values()],
    )
    for line in check.warnings:
        print(f"torchmatrix: warning: {line}", file=sys.stderr)
    if check.problems:
        raise RunError("\n".join(check.problems))
    return check


def _environment(
    request: RunRequest, book: OutcomeBook, probed: Environment | ProbeError | None
) -> tuple[Environment, bool]:
    """What the reports say about this environment's torch, and whether cells can run.

    When it is unusable, every planned run errors with the reason.
    """
    if probed is None:
        tail = _tail(request.install_log)
        _fail_all(book, f"torch=={request.version} failed to install (see {request.install_log})", tail)
        return Environment.without_torch("none (torch did not install)"), False
    if isinstance(probed, ProbeError):
        _fail_all(book, str(probed), "")
        return Environment.without_torch("none (torch is not importable)"), False
    environment = probed
    if request.version != "system" and not environment.has_release(request.version):
        _fail_all(
            book,
            f"this environment has torch {environment.torch}, not {request.version}; rebuild the virtualenv (run nox without -R) or pass --torch system",
            "",
        )
        return environment, False
    return environment.running(sys.executable), True


def _fail_all(book: OutcomeBook, message: str, text: str) -> None:
    for key in book.runs:
        book.fail_run(key, Status.ERROR, message, text)


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
    environment: Environment,
    progress: Progress,
    forks: PreloadedForks,
) -> None:
    gpu_count = environment.gpu_count
    node_size = request.gpus_per_node or gpu_count or None
    runnable = []
    for run in runs:
        if node_size and run.cell.world_size > node_size and not request.multinode_launcher:
            book.fail_run(
                run.key,
                Status.SKIPPED,
                f"needs {run.cell.world_size} GPUs; this node has {node_size} (pass --multinode-launcher to span nodes)",
            )
        else:
            runnable.append(run)
    cores = [] if gpu_count else sorted(os.sched_getaffinity(0))
    slots = _slots(request, environment)
    finished: set[Cell] = set()

    def report_finished_cells() -> None:
        for cell in cells:
            if cell not in finished and book.cell_done(cell):
                finished.add(cell)
                _write_cell_report(request, environment, book, cell)
                tests = [(f"{run.suite.name}::{o.test}", o.status) for run, o in book.for_cell(cell)]
                progress.cell_finished(cell.id, tests, book.counts(finished))
        progress.heartbeat(f"{count(len(cells) - len(finished), 'cell')} to finish")

    def scheduler(groups: list[Group], **kwargs) -> Scheduler:
        return Scheduler(
            [with_launcher(group, node_size, request.multinode_launcher) for group in groups],
            start=lambda group: start_group(request, group, environment, forks),
            slots=slots,
            gpu_ids=list(range(gpu_count)),
            core_ids=cores,
            **kwargs,
        )

    # A read takes about a second; on CPU another pytest process per slot would only add a torch import
    # (the ETA counts such a read pass's reads one after another: LaterPhases.reads_side_by_side).
    group_slots = 1 if request.cross_version_reads and not gpu_count else slots
    groups = group_runs(runnable, group_slots, fillers=not gpu_count)
    if request.selection.tests:
        groups = [replace(group, only_tests=request.selection.tests) for group in groups]
    report_finished_cells()
    if groups:
        progress.say(
            f"torchmatrix: torch {request.version}: starting {count(len(groups), 'pytest process', 'pytest processes')} "
            f"on {slots} slots; the first cell reports once torch is imported and the suites are collected"
        )
    scheduler(groups, book=book, on_update=report_finished_cells).run()
    report_finished_cells()
    confirmation.confirm_failures(book, request.confirm_limit, scheduler, progress, slots)


def _write_reports(
    request: RunRequest,
    cells: list[Cell],
    book: OutcomeBook,
    environment: Environment,
    started: str,
    load_average: dict,
) -> None:
    for cell in cells:
        _write_cell_report(request, environment, book, cell)
    _write_plan(request, cells, book, environment, started, finished=True, load_average=load_average)
    junit.merge_run(request.run_dir, request.matrix.baseline)
    if request.cross_version_reads:
        return
    if not point_latest(request.reports, request.run_id):
        print(
            f"torchmatrix: warning: {request.reports / 'latest'} is not the link torchmatrix keeps to the last run "
            f"(a directory put there?); left it alone, this run is {request.run_dir}",
            file=sys.stderr,
        )


def _write_plan(
    request: RunRequest,
    cells: list[Cell],
    book: OutcomeBook,
    environment: Environment,
    started: str,
    *,
    finished: bool,
    load_average: dict | None = None,
) -> None:
    """plan.json, first before any cell runs (with what `report` needs to rebuild the cells of a
    runner that was killed: each cell's axis values and the suites), then again at the end."""
    planned = {run.suite.name for run in book.runs.values()}
    write_plan(
        request.version_dir,
        RunPlan(
            torch=request.version,
            started=started,
            matrix=str(request.matrix.path),
            matrix_sha256=request.matrix.digest,
            baseline=request.matrix.baseline,
            thresholds=dataclasses.asdict(request.matrix.report),
            selection=request.cell_selection,
            environment=environment,
            cells=tuple(cell.id for cell in cells),
            cell_axes=tuple(dict(cell) for cell in cells),
            suites={
                name: PlannedSuite(suite.path, suite.timeout, tuple(suite.axes))
                for name, suite in request.matrix.suites.items()
                if name in planned
            },
            pool_starts=book.pool_starts,
            finished=finished,
            load_average=load_average or {},
        ),
    )


def _write_cell_report(request: RunRequest, environment: Environment, book: OutcomeBook, cell: Cell) -> None:
    """The cell's JUnit file as its outcomes stand, with paths under the project written relative to it."""
    junit.write_cell(
        request.version_dir,
        request.version,
        environment,
        cell,
        book.for_cell(cell),
        book.cell_started(cell),
        project=request.matrix.root,
    )
