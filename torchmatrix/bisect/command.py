"""`torchmatrix bisect`: the first torch release between two pins where a regression appears.

Each step installs one version into its gpu_matrix venv (torchmatrix.env.version_venv) and runs
`torchmatrix run` there on only the regressed test in only its cell; the runner re-runs a failure
alone, which decides the step's verdict. The pins come from a run's upgrade diff (`--from RUN`:
its confirmed regressions, already decided on both pins) or from `--good/--bad` with a selection,
which runs both pins first to find the tests that regressed.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.bisect.search import Bisection, Outcome
from torchmatrix.bisect.versions import IndexUnlisted, VersionError, offered_versions
from torchmatrix.env.envdir_lock import EnvdirBusy, EnvdirUnlockable, lock_envdir
from torchmatrix.env.version_venv import prepare_venv
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.config import Matrix
from torchmatrix.matrix.selection import EVERY_CELL, CellSelection
from torchmatrix.messages.cross_version import SUITE, writer_of_read
from torchmatrix.reports.records import RunResults, TestRecord
from torchmatrix.reports.reproducible import is_reproducible, repro_command
from torchmatrix.reports.run_reader import load_results
from torchmatrix.reports.upgrade_diff import upgrade_diffs
from torchmatrix.run.interrupts import Interrupts
from torchmatrix.run.progress import format_seconds
from torchmatrix.run.run_directory import new_run_id
from torchmatrix.status import Confirmation, Status, count
from torchmatrix.user_error import UserError

REPORT_NAME = "bisect"
IMPORT_SECONDS = 300
STEP_GRACE_SECONDS = 30


class BisectError(UserError):
    """Nothing to bisect, or a step the runner refused; the message says what to change."""


@dataclass(frozen=True)
class Regression:
    """A test that passes on the good pin and fails alone on the bad one, in the cell that ran it."""

    suite: str
    test: str
    cell: str
    axes: dict[str, str]
    good: str
    bad: str
    root_cause: str

    @property
    def name(self) -> str:
        return f"{self.suite}::{self.test} [{self.cell}]"


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


class Steps:
    """Installs and runs of one bisect: numbered [k/N] as the matrix's progress counts versions."""

    def __init__(self, request: BisectRequest, out: Path, planned: int):
        self.request, self.out, self.planned = request, out, planned
        self.started = time.time()
        self.count = 0
        self.log: list[dict] = []

    def run(self, version: str, selection: list[str]) -> tuple[RunResults | None, Outcome, str]:
        """Install `version` (or reuse its venv) and run `selection` there; the results, or None,
        why it was skipped (did not install, or installed and does not import torch) and the reason."""
        self.count += 1
        self.planned = max(self.planned, self.count)
        step = {"version": version, "selection": selection}
        begun = time.time()
        print(
            f"torchmatrix bisect: step {self.count}: torch {version}: its gpu_matrix venv (installed unless it was before)",
            flush=True,
        )
        venv, installed, reused = prepare_venv(
            self.request.matrix, self.request.envdir, version, self.out / "logs" / f"torch-{version}"
        )
        how = (
            "reusing its venv"
            if reused
            else "installed into its venv"
            if installed.ok
            else "tried to install into its venv"
        )
        print(f"torchmatrix bisect: step {self.count}: torch {version}: {how} {venv.location}", flush=True)
        if not installed.ok:
            print(f"torchmatrix bisect: step {self.count}: torch {version} did not install: {installed.reason}")
            self.log.append({**step, "installed": False, "reason": installed.reason, "seconds": _since(begun)})
            return None, Outcome.NOT_INSTALLED, installed.reason
        broken = import_failure(venv)
        if broken:
            print(f"torchmatrix bisect: step {self.count}: torch {version} installed but does not import: {broken}")
            self.log.append({**step, "installed": True, "imports": False, "reason": broken, "seconds": _since(begun)})
            return None, Outcome.NOT_IMPORTABLE, broken
        run_id = f"step{self.count}-torch-{version}"
        command = [
            str(venv.python), "-m", "torchmatrix", "run",
            "--config", str(self.request.matrix.path),
            "--torch", "system",
            "--reports", str(self.out / "steps"),
            "--run-id", run_id,
            "--progress-part", f"{self.count}/{self.planned}",
            "--progress-since", f"{self.started:.3f}",
            *(["--slots", str(self.request.slots)] if self.request.slots else []),
            *selection,
        ]  # fmt: skip
        print(
            f"torchmatrix bisect: step {self.count}: torch {version}: running {shlex.join(selection) or 'every cell of matrix.toml'}",
            flush=True,
        )
        try:
            code = run_step_process(command, venv.environment())
        except KeyboardInterrupt:
            self.log.append({**step, "installed": True, "reused": reused, "run": run_id, "interrupted": True,
                             "seconds": _since(begun)})  # fmt: skip
            raise
        if code not in (0, 1):
            raise BisectError(f"torch {version}: `torchmatrix run` ended with exit code {code} (see above)")
        self.log.append({**step, "installed": True, "reused": reused, "run": run_id, "seconds": _since(begun)})
        return load_results(self.out / "steps" / run_id), Outcome.PASSED, ""


def import_failure(venv) -> str:
    """Why torch does not import in `venv` (the exception's last line, e.g. a missing libcudart), or ""."""
    done = subprocess.run(
        [str(venv.python), "-c", "import torch"],
        env=venv.environment(),
        capture_output=True,
        text=True,
        check=False,
        timeout=IMPORT_SECONDS,
    )
    if done.returncode == 0:
        return ""
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"python -c 'import torch' exited {done.returncode}"


def run_step_process(command: list[str], env: dict[str, str]) -> int:
    """Run a step's `torchmatrix run` in a process group of its own; interrupted (Ctrl-C, SIGTERM),
    the group is sent SIGTERM (the runner writes what ran and ends its tests), then SIGKILL after
    STEP_GRACE_SECONDS, so nothing the step started outlives the bisect."""
    process = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        return process.wait()
    except BaseException:
        _end_group(process)
        raise


def _end_group(process: subprocess.Popen) -> None:
    for signum, grace in ((signal.SIGTERM, STEP_GRACE_SECONDS), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        try:  # the runner is gone; its group may still hold what it started
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


def run_bisect(request: BisectRequest) -> int:
    """Bisect every regression; print one line each; write bisect.md and bisect.json; 0 when each
    got a first bad version, 1 when a search stopped without one."""
    lock = None
    try:
        lock = lock_envdir(request.envdir)
    except EnvdirBusy as error:
        raise BisectError(str(error)) from None
    except EnvdirUnlockable as error:
        print(f"torchmatrix: warning: {error}; a matrix run using these venvs is not kept apart", file=sys.stderr)
    try:
        with Interrupts() as interrupts:
            return _bisect(request, interrupts)
    finally:
        if lock is not None:
            os.close(lock)


def _bisect(request: BisectRequest, interrupts: Interrupts) -> int:
    out = (request.from_run or request.reports) / f"bisect-{new_run_id()}"
    regressions = regressions_of_run(load_results(request.from_run)) if request.from_run else []
    created = next(path for path in reversed([out, *out.parents]) if not path.exists())
    out.mkdir(parents=True)
    print(f"torchmatrix bisect: writing to {out}", flush=True)
    steps = Steps(request, out, 0 if request.from_run else 2)
    searches: list[tuple[Regression, Bisection]] = []
    try:
        regressions = regressions or _regressions_of_pins(request, steps)
        searches = _searches(request, regressions)
        steps.planned += sum(math.ceil(math.log2(len(s.candidates) + 1)) for s in _distinct_ranges(searches))
        while batch := next_batch(searches):
            version = batch[0][1].next_version()
            results, skipped, reason = steps.run(version, bisect_selection([regression for regression, _ in batch]))
            for regression, search in batch:
                if results is None:
                    search.record(version, skipped, reason)
                    continue
                outcome, detail = verdict(_record(results, regression))
                print(
                    f"torchmatrix bisect: torch {version}: {regression.name} {outcome.value}"
                    + (f": {detail}" if detail else "")
                )
                search.record(version, outcome, detail)
    except (BisectError, VersionError, IndexUnlisted):
        shutil.rmtree(created, ignore_errors=True)  # a refusal leaves nothing behind but the venvs
        raise
    except KeyboardInterrupt:
        interrupts.writing_reports()
        print("torchmatrix bisect: interrupted; writing what was decided", file=sys.stderr, flush=True)
    interrupted = interrupts.interrupted
    lines = [verdict_line(regression, search, interrupted=interrupted) for regression, search in searches]
    if interrupted and not searches:
        lines = ["interrupted before a search began: no release was judged"]
    _write_report(out, request, searches, lines, steps, interrupted=interrupted)
    print(
        f"torchmatrix bisect: {count(steps.count, 'step')} in {format_seconds(time.time() - steps.started)}; report {out / (REPORT_NAME + '.md')}"
    )
    for line in lines:
        print(line)
    if interrupted:
        return ExitCode.INTERRUPTED
    return ExitCode.FAILED if any(search.stopped is not None for _, search in searches) else ExitCode.PASSED


def _searches(request: BisectRequest, regressions: list[Regression]) -> list[tuple[Regression, Bisection]]:
    """One search per regression over the releases between its pins (the index is listed once per pair)."""
    searches = []
    offered: dict[tuple[str, str], list[str]] = {}
    for regression in regressions:
        pins = (regression.good, regression.bad)
        if pins not in offered:
            offered[pins] = offered_versions(request.matrix, *pins)
        candidates = offered[pins]
        print(
            f"torchmatrix bisect: {regression.name}: passes on {regression.good}, fails alone on {regression.bad}; "
            f"{count(len(candidates), 'version')} between them on the index ({', '.join(candidates) or 'none'}): "
            f"at most {math.ceil(math.log2(len(candidates) + 1))} to install",
            flush=True,
        )
        searches.append((regression, Bisection(regression.good, regression.bad, candidates)))
    return searches


def _distinct_ranges(searches: list[tuple[Regression, Bisection]]) -> list[Bisection]:
    """One search per (cell, good, bad): the tests of one cell that regressed together share its steps."""
    return list({(r.cell, r.good, r.bad): s for r, s in searches}.values())


def regressions_of_run(results: RunResults) -> list[Regression]:
    """The confirmed regressions of every version of a run against its baseline (broken checkpoint
    directions are not among them: a step runs one torch, and a direction needs two)."""
    regressions = [
        _regression(change.after, results.cells.get(change.after.run_cell, {}), diff.before, diff.after)
        for diff in upgrade_diffs(results)
        for change in diff.regressions
        if writer_of_read(change.after.suite, change.after.test) is None
    ]
    directions = direction_breaks(results)
    if directions:
        print(
            f"torchmatrix bisect: not searched, {count(len(directions), 'broken checkpoint direction')} (a step runs one torch; "
            "reproduce each with the command below, a torch-only script, and run it per release):",
            *(f"  {line}" for line in directions),
            sep="\n",
            flush=True,
        )
    if not regressions:
        raise BisectError(
            f"run {results.run_id} has no confirmed regression against its baseline {results.baseline} that bisect can search"
            + (
                f" ({count(len(directions), 'broken checkpoint direction')}: bisect cannot search one, a step runs one torch; "
                f"`torchmatrix repro` of the read failure writes a torch-only script to run per release, e.g. {directions[0]})"
                if directions
                else "; bisect a run whose upgrade diff lists one, or pass --good and --bad"
            )
        )
    return regressions


def direction_breaks(results: RunResults) -> list[str]:
    """Each confirmed failed cross_version read of the run: its direction, cell, versions and reproduce command."""
    breaks = []
    for record in results.tests:
        writer = writer_of_read(record.suite, record.test)
        if writer is None or not is_reproducible(record):
            continue
        direction = "rollback" if record.torch == results.baseline else "forward"
        breaks.append(
            f"{direction} in {record.run_cell}: torch {record.torch} cannot read torch {writer}'s checkpoint; "
            f"reproduce: {repro_command(results.run_id, record)}"
        )
    return breaks


def _regressions_of_pins(request: BisectRequest, steps: Steps) -> list[Regression]:
    """Run the selection on the bad pin, then its confirmed failures on the good pin: those that pass there."""
    filters = request.cell_selection.arguments()
    bad_results, skipped, reason = steps.run(request.bad, filters)
    if bad_results is None:
        raise BisectError(f"--bad {request.bad} {skipped.value}: {reason}")
    failing = [
        record
        for record in bad_results.tests
        if record.status.is_failing and record.confirmation == Confirmation.FAILS_ALONE and record.ran_in is None
    ]
    if not failing:
        raise BisectError(
            f"nothing fails alone on --bad {request.bad} in the selection ({shlex.join(filters) or 'every cell'}); "
            "widen it, or pick the release the upgrade diff flagged"
            + (
                " (a broken checkpoint direction never shows here: a step runs one torch, where cross_version's write "
                "has no reader; `torchmatrix repro` of the run's read failure writes a torch-only script to run per release)"
                if SUITE in request.matrix.suites
                else ""
            )
        )
    tests = sorted({f"--test={record.suite}::{record.test}" for record in failing})
    good_results, skipped, reason = steps.run(request.good, [*filters, *tests])
    if good_results is None:
        raise BisectError(f"--good {request.good} {skipped.value}: {reason}")
    regressions = []
    for record in failing:
        on_good = next((r for r in good_results.tests if _same_test(r, record)), None)
        if on_good is not None and on_good.status is Status.PASSED:
            regressions.append(_regression(record, bad_results.cells.get(record.cell, {}), request.good, request.bad))
        else:
            state = on_good.status.value if on_good else "not run"
            print(
                f"torchmatrix bisect: {record.suite}::{record.test} [{record.cell}] is {state} on {request.good} too: not a regression"
            )
    if not regressions:
        raise BisectError(
            f"every test that fails on {request.bad} fails on {request.good} too: nothing regressed between them"
        )
    return regressions


def _regression(record: TestRecord, axes: dict[str, str], good: str, bad: str) -> Regression:
    return Regression(record.suite, record.test, record.run_cell, dict(axes), good, bad, record.message)


def next_batch(searches: list[tuple[Regression, Bisection]]) -> list[tuple[Regression, Bisection]]:
    """The searches one step serves: the first open one, and every other open one of the same cell
    that asks for the same version next (the tests of one cell that regressed together)."""
    open_searches = [(r, s) for r, s in searches if s.next_version() is not None]
    if not open_searches:
        return []
    first, search = open_searches[0]
    version = search.next_version()
    return [(r, s) for r, s in open_searches if r.cell == first.cell and s.next_version() == version]


def bisect_selection(regressions: list[Regression]) -> list[str]:
    """`torchmatrix run` arguments for only these tests in only their (one) cell."""
    return [
        *(f"--only={axis}={value}" for axis, value in regressions[0].axes.items()),
        *sorted({f"--test={regression.suite}::{regression.test}" for regression in regressions}),
    ]


def _same_test(record: TestRecord, other: TestRecord) -> bool:
    return (record.suite, record.test, record.run_cell) == (other.suite, other.test, other.run_cell)


def _record(results: RunResults, regression: Regression) -> TestRecord | None:
    return next(
        (
            r
            for r in results.tests
            if (r.suite, r.test, r.run_cell) == (regression.suite, regression.test, regression.cell)
        ),
        None,
    )


def verdict(record: TestRecord | None) -> tuple[Outcome, str]:
    """A step's outcome for the bisected test: a failure counts only when it failed again alone."""
    if record is None:
        return Outcome.NO_VERDICT, "the step reported nothing for this test"
    if record.status is Status.PASSED:
        return Outcome.PASSED, ""
    if not record.status.is_failing:
        return Outcome.NO_VERDICT, f"{record.status.value}: {record.message}"
    if record.confirmation == Confirmation.FAILS_ALONE:
        return Outcome.FAILS, record.message
    if record.confirmation == Confirmation.PASSED_ALONE:
        return Outcome.FLAKY, f"failed ({record.message}), then passed alone: flaky or order-dependent"
    return Outcome.NO_VERDICT, f"failed ({record.message}) and was not re-run alone"


def verdict_line(regression: Regression, search: Bisection, *, interrupted: bool = False) -> str:
    """`first bad: 2.14.0 (2.13.0 passed) — <root cause>`, or why the search has no answer."""
    if search.stopped is not None:
        outcome, detail = search.tried[search.stopped]
        return (
            f"{regression.name}: no verdict: torch {search.stopped} {outcome.value} ({detail}); "
            f"the search stopped between {search.last_good} (passed) and {search.first_bad} (fails)"
        )
    if interrupted and search.next_version() is not None:
        return (
            f"{regression.name}: interrupted: the first bad is {search.first_bad} or one of the untried releases "
            f"after {search.last_good} (passed): {', '.join(search.untested_between)}"
        )
    root = search.tried.get(search.first_bad, (None, regression.root_cause))[1] or regression.root_cause
    skipped = search.untested_between
    if skipped:
        reasons = "; ".join(f"{v} {search.tried[v][0].value}: {search.tried[v][1]}" for v in skipped)
        return (
            f"{regression.name}: first bad: one of {', '.join([*skipped, search.first_bad])} "
            f"({search.last_good} passed; {reasons}) — {root}"
        )
    return f"{regression.name}: first bad: {search.first_bad} ({search.last_good} passed) — {root}"


def _step_state(step: dict) -> str:
    """A step's `installed` column in bisect.md."""
    if not step["installed"]:
        return "no: " + step["reason"]
    if step.get("imports") is False:
        return "yes, but torch does not import: " + step["reason"]
    state = "reused its venv" if step.get("reused") else "yes"
    return state + ("; interrupted" if step.get("interrupted") else "")


def _write_report(
    out: Path, request: BisectRequest, searches: list, lines: list[str], steps: Steps, *, interrupted: bool
) -> None:
    data = {
        "out": str(out),
        "interrupted": interrupted,
        "from_run": str(request.from_run) if request.from_run else None,
        "seconds": _since(steps.started),
        "steps": steps.log,
        "regressions": [
            {
                "suite": regression.suite,
                "test": regression.test,
                "cell": regression.cell,
                "good": regression.good,
                "bad": regression.bad,
                "candidates": search.candidates,
                "first_bad": None if search.stopped or search.next_version() else search.first_bad,
                "last_good": search.last_good,
                "stopped_at": search.stopped,
                "untested_between": search.untested_between,
                "tried": {v: {"outcome": o.value, "detail": d} for v, (o, d) in search.tried.items()},
                "verdict": line,
            }
            for (regression, search), line in zip(searches, lines)
        ],
    }
    file_writes.write_text(out / f"{REPORT_NAME}.json", json.dumps(data, indent=2) + "\n")
    markdown = [
        "# torch bisect",
        "",
        f"{count(steps.count, 'step')} in {format_seconds(data['seconds'])}"
        + (f", regressions of run {request.from_run}" if request.from_run else "")
        + ("; interrupted: what was decided before the signal" if interrupted else ""),
        "",
        *(f"- {line}" for line in lines),
        "",
        "| step | torch | installed | selection | seconds |",
        "|---|---|---|---|---|",
        *(
            f"| {i} | {s['version']} | {_step_state(s)} | `{shlex.join(s['selection'])}` | {s['seconds']:.0f} |"
            for i, s in enumerate(steps.log, 1)
        ),
    ]
    file_writes.write_text(out / f"{REPORT_NAME}.md", "\n".join(markdown) + "\n")


def _since(begun: float) -> float:
    return round(time.time() - begun, 1)
