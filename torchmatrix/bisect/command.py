"""`torchmatrix bisect`: the first torch release between two pins where a regression appears.

Each step installs one version into its gpu_matrix venv (torchmatrix.env.version_venv) and runs
`torchmatrix run` there on only the regressed test in only its cell; the runner re-runs a failure
alone, which decides the step's verdict. A broken checkpoint direction's step writes with one
version and reads with the other (torchmatrix.bisect.directions). The pins come from a run's
upgrade diff (`--from RUN`: its confirmed regressions and broken directions, already decided on
both pins) or from `--good/--bad` with a selection, which runs both pins first to find the tests
and directions that regressed.
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
from torchmatrix.bisect.commit_range import commit_range_line
from torchmatrix.bisect.directions import (
    WRITE_TEST,
    broken_directions,
    direction_step,
    pins_step,
    read_of,
    write_failure,
)
from torchmatrix.bisect.failures import FailureSearch, cell_selection, grouped
from torchmatrix.bisect.regression import Regression
from torchmatrix.bisect.search import Bisection, Outcome
from torchmatrix.bisect.versions import VersionError, offered_versions
from torchmatrix.env.channel_install import IndexUnlisted
from torchmatrix.env.envdir_lock import EnvdirBusy, EnvdirUnlockable, lock_envdir
from torchmatrix.env.version_venv import prepare_venv
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.config import Matrix
from torchmatrix.matrix.selection import EVERY_CELL, CellSelection
from torchmatrix.messages.cross_version import SUITE, writer_of_read
from torchmatrix.reports.machine_paths import without_machine_paths
from torchmatrix.reports.records import RunResults, TestRecord
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
        self.venvs: dict[str, tuple] = {}  # version -> (venv, reused): a venv prepared once per bisect
        self.git_versions: dict[str, str] = {}  # version -> torch.version.git_version, for the commit range

    def run(self, version: str, selection: list[str]) -> tuple[RunResults | None, Outcome, str]:
        """Install `version` (or reuse its venv) and run `selection` there; the results, or None,
        why it was skipped (did not install, or installed and does not import torch) and the reason."""
        step, begun = self._begin(version, {"selection": selection}), time.time()
        skipped = self._prepare(version, step, begun)
        if skipped:
            return None, *skipped
        venv, reused = self.venvs[version]
        run_id = f"step{self.count}-torch-{version}"
        print(
            f"torchmatrix bisect: step {self.count}: torch {version}: running {shlex.join(selection) or 'every cell of matrix.toml'}",
            flush=True,
        )
        self._torchmatrix(venv, version, run_id, ["--torch", "system", *selection], step, begun)
        self.log.append({**step, "installed": True, "reused": reused, "run": run_id, "seconds": _since(begun)})
        results = load_results(self.out / "steps" / run_id)
        self.git_versions[version] = results.versions[0].git_version if results.versions else ""
        return results, Outcome.PASSED, ""

    def pair(
        self, version: str, pairs: list[tuple[str, str]], selection: list[str]
    ) -> tuple[RunResults | None, Outcome, str]:
        """Judge checkpoint directions on `version`: in one run directory, each (writer, reader)
        pair's writer writes the selected cells' cross_version checkpoints and its reader reads them.
        `version` is skipped as `run` skips it; the other side (the baseline) must install and import."""
        step = self._begin(version, {"selection": selection, "checkpoints": [list(pair) for pair in pairs]})
        begun = time.time()
        sides = list(dict.fromkeys([version, *(v for pair in pairs for v in pair)]))
        for side in sides:
            skipped = self._prepare(side, step, begun)
            if skipped and side == version:
                return None, *skipped
            if skipped:
                raise BisectError(
                    f"torch {side}, the other side of every checkpoint this bisect reads, {skipped[0].value}: {skipped[1]}"
                )
        run_id = f"step{self.count}-torch-{version}"
        for writer in dict.fromkeys(writer for writer, _ in pairs):
            readers = [reader for w, reader in pairs if w == writer]
            print(
                f"torchmatrix bisect: step {self.count}: torch {writer}: writing checkpoints for torch {', '.join(readers)} "
                f"({shlex.join(selection) or 'every cell'})",
                flush=True,
            )
            peers = [f"--peer={reader}" for reader in readers]
            arguments = ["--torch", writer, *peers, *selection, f"--test={SUITE}::{WRITE_TEST}"]
            self._torchmatrix(self.venvs[writer][0], writer, run_id, arguments, step, begun)
        for reader in dict.fromkeys(reader for _, reader in pairs):
            writers = [writer for writer, r in pairs if r == reader]
            print(
                f"torchmatrix bisect: step {self.count}: torch {reader}: reading the checkpoints of torch {', '.join(writers)}",
                flush=True,
            )
            peers = [f"--peer={writer}" for writer in writers]
            arguments = ["--cross-version-reads", "--torch", reader, *peers, *selection]
            self._torchmatrix(self.venvs[reader][0], reader, run_id, arguments, step, begun)
        reused = all(self.venvs[side][1] for side in sides)
        self.log.append({**step, "installed": True, "reused": reused, "run": run_id, "seconds": _since(begun)})
        results = load_results(self.out / "steps" / run_id)
        self.git_versions[version] = results.versions[0].git_version if results.versions else ""
        return results, Outcome.PASSED, ""

    def _begin(self, version: str, step: dict) -> dict:
        self.count += 1
        self.planned = max(self.planned, self.count)
        return {"version": version, **step}

    def _prepare(self, version: str, step: dict, begun: float) -> tuple[Outcome, str] | None:
        """Make `version`'s venv ready once per bisect (reused, or installed); why it cannot be, else None."""
        if version in self.venvs:
            return None
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
            return Outcome.NOT_INSTALLED, installed.reason
        broken = import_failure(venv)
        if broken:
            print(f"torchmatrix bisect: step {self.count}: torch {version} installed but does not import: {broken}")
            self.log.append({**step, "installed": True, "imports": False, "reason": broken, "seconds": _since(begun)})
            return Outcome.NOT_IMPORTABLE, broken
        self.venvs[version] = (venv, reused)
        return None

    def _torchmatrix(self, venv, version: str, run_id: str, arguments: list[str], step: dict, begun: float) -> None:
        """`torchmatrix run` in `venv` into the step's run directory; a refusal ends the bisect."""
        command = [
            str(venv.python), "-m", "torchmatrix", "run",
            "--config", str(self.request.matrix.path),
            "--reports", str(self.out / "steps"),
            "--run-id", run_id,
            "--progress-part", f"{self.count}/{self.planned}",
            "--progress-since", f"{self.started:.3f}",
            "--no-report-hint",
            *(["--slots", str(self.request.slots)] if self.request.slots else []),
            *arguments,
        ]  # fmt: skip
        try:
            code = run_step_process(command, venv.environment())
        except KeyboardInterrupt:
            self.log.append({**step, "installed": True, "run": run_id, "interrupted": True, "seconds": _since(begun)})
            raise
        if code not in (0, 1):
            raise BisectError(f"torch {version}: `torchmatrix run` ended with exit code {code} (see above)")


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
    searches: list[FailureSearch] = []
    try:
        regressions = regressions or _regressions_of_pins(request, steps)
        searches = _searches(request, regressions)
        steps.planned += sum(math.ceil(math.log2(len(s.candidates) + 1)) for s in _distinct_ranges(searches))
        matrix_cells = request.matrix.cells()
        while batch := next_batch(searches):
            version = batch[0].bisection.next_version()
            judged = [regression for search in batch for regression in search.regressions]
            if judged[0].direction:
                pairs = direction_step(judged, version)
                results, skipped, reason = steps.pair(version, pairs, cell_selection(judged, matrix_cells))
            else:
                results, skipped, reason = steps.run(version, bisect_selection(judged, matrix_cells))
            for search in batch:
                verdicts = (
                    [(skipped, reason)] * len(search.regressions)
                    if results is None
                    else [step_verdict(results, regression, version) for regression in search.regressions]
                )
                parts = search.record(version, verdicts)
                at = next(i for i, other in enumerate(searches) if other is search)
                searches[at : at + 1] = parts
                for part in parts if results is not None else []:
                    outcome, detail = part.bisection.tried[version]
                    print(
                        f"torchmatrix bisect: torch {version}: {part.name} {outcome.value}"
                        + (f": {detail}" if detail else "")
                    )
    except (BisectError, VersionError, IndexUnlisted):
        shutil.rmtree(created, ignore_errors=True)  # a refusal leaves nothing behind but the venvs
        raise
    except KeyboardInterrupt:
        interrupts.writing_reports()
        print("torchmatrix bisect: interrupted; writing what was decided", file=sys.stderr, flush=True)
    interrupted = interrupts.interrupted
    lines = [
        without_machine_paths(verdict_line(search, search.bisection, interrupted=interrupted), out, request.matrix.root)
        for search in searches
    ]
    if interrupted and not searches:
        lines = ["interrupted before a search began: no release was judged"]
    ranges = [commit_range_line(b.last_good, b.first_bad, steps.git_versions) for b in _distinct_ranges(searches)]
    lines += [line for line in ranges if line and not interrupted]
    _write_report(out, request, searches, lines, steps, interrupted=interrupted)
    print(
        f"torchmatrix bisect: {count(steps.count, 'step')} in {format_seconds(time.time() - steps.started)}; report {out / (REPORT_NAME + '.md')}"
    )
    for line in lines:
        print(line)
    if interrupted:
        return ExitCode.INTERRUPTED
    return ExitCode.FAILED if any(s.bisection.stopped is not None for s in searches) else ExitCode.PASSED


def _searches(request: BisectRequest, regressions: list[Regression]) -> list[FailureSearch]:
    """One search per distinct failure over the releases between its pins (the index is listed once per pair)."""
    searches = []
    offered: dict[tuple[str, str], list[str]] = {}
    for failure in grouped(regressions):
        regression = failure[0]
        pins = (regression.good, regression.bad)
        if pins not in offered:
            offered[pins] = offered_versions(request.matrix, *pins)
        candidates = offered[pins]
        search = FailureSearch(failure, Bisection(regression.good, regression.bad, candidates))
        print(
            f"torchmatrix bisect: {search.name}: {_pins_said(regression)}; "
            f"{count(len(candidates), 'version')} between them on the index ({', '.join(candidates) or 'none'}): "
            f"at most {math.ceil(math.log2(len(candidates) + 1))} to install",
            flush=True,
        )
        searches.append(search)
    return searches


def _pins_said(regression: Regression) -> str:
    """What the pins showed, as the search's opening line says it."""
    if regression.direction:
        writer, reader = regression.writer_and_reader(regression.bad)
        return f"torch {reader} cannot read torch {writer}'s checkpoint"
    return f"passes on {regression.good}, fails alone on {regression.bad}"


def _distinct_ranges(searches: list[FailureSearch]) -> list[Bisection]:
    """One search per (cells, direction, good, bad): failures of the same cells share their steps."""
    return list(
        {(tuple(s.cells), s.direction, s.bisection.good, s.bisection.bad): s.bisection for s in searches}.values()
    )


def regressions_of_run(results: RunResults) -> list[Regression]:
    """The confirmed regressions of every version of a run against its baseline, and its confirmed
    broken checkpoint directions (a read failure is the pair's: searched by steps that write with
    one version and read with the other, never as a test of the version that read)."""
    regressions = [
        _regression(change.after, results.cells.get(change.after.run_cell, {}), diff.before, diff.after)
        for diff in upgrade_diffs(results)
        for change in diff.regressions
        if writer_of_read(change.after.suite, change.after.test) is None
    ]
    regressions += broken_directions(results, results.baseline)
    if not regressions:
        raise BisectError(
            f"run {results.run_id} has no confirmed regression or broken checkpoint direction against its baseline "
            f"{results.baseline}; bisect a run whose upgrade diff lists one, or pass --good and --bad"
        )
    return regressions


def _regressions_of_pins(request: BisectRequest, steps: Steps) -> list[Regression]:
    """The tests that fail alone on the bad pin and pass on the good one, and, where the matrix has
    cross_version, the checkpoint directions between the pins that broke (a matrix of cross_version
    alone has no test one torch can fail: its pins run only the directions' step)."""
    has_tests, has_directions = bool(set(request.matrix.suites) - {SUITE}), SUITE in request.matrix.suites
    tests, refusal = _tests_of_pins(request, steps) if has_tests else ([], "")
    directions = _directions_of_pins(request, steps) if has_directions else []
    if not tests and not directions:
        loaded = f"every checkpoint between {request.good} and {request.bad} loaded exactly both ways"
        raise BisectError("; ".join([*([refusal] if refusal else []), *([loaded] if has_directions else [])]))
    return [*tests, *directions]


def _tests_of_pins(request: BisectRequest, steps: Steps) -> tuple[list[Regression], str]:
    """Run the selection on the bad pin, then its confirmed failures on the good pin: those that
    pass there; none, and why, when nothing regressed."""
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
        return [], (
            f"nothing fails alone on --bad {request.bad} in the selection ({shlex.join(filters) or 'every cell'}); "
            "widen it, or pick the release the upgrade diff flagged"
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
    return (
        regressions,
        f"every test that fails on {request.bad} fails on {request.good} too: nothing regressed between them",
    )


def _directions_of_pins(request: BisectRequest, steps: Steps) -> list[Regression]:
    """Both checkpoint directions between the pins, in the selected cells: the good pin reads the bad
    pin's checkpoints (rollback) and the bad pin the good pin's (forward); each confirmed failed read
    is a direction to search, with the good pin as the baseline."""
    results, skipped, reason = steps.pair(
        request.bad, pins_step(request.good, request.bad), request.cell_selection.arguments()
    )
    if results is None:
        raise BisectError(f"--bad {request.bad} {skipped.value}: {reason}")
    return broken_directions(results, request.good)


def _regression(record: TestRecord, axes: dict[str, str], good: str, bad: str) -> Regression:
    return Regression(record.suite, record.test, record.run_cell, dict(axes), good, bad, record.message)


def next_batch(searches: list[FailureSearch]) -> list[FailureSearch]:
    """The searches one step serves: the first open one, and every other open one of the same cells
    and kind (tests, or a checkpoint direction) that asks for the same version next (the failures
    of the same cells that regressed together)."""
    open_searches = [s for s in searches if s.bisection.next_version() is not None]
    if not open_searches:
        return []
    first = open_searches[0]
    version = first.bisection.next_version()
    return [
        s
        for s in open_searches
        if (s.cells, s.direction) == (first.cells, first.direction) and s.bisection.next_version() == version
    ]


def bisect_selection(regressions: list[Regression], matrix_cells: list[Cell]) -> list[str]:
    """`torchmatrix run` arguments for only these tests in only their cells."""
    return [
        *cell_selection(regressions, matrix_cells),
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


def step_verdict(results: RunResults, regression: Regression, version: str) -> tuple[Outcome, str]:
    """What a step on `version` showed for `regression`: its test's verdict, or for a checkpoint
    direction the verdict of the read of the step's checkpoint (no verdict when its writer failed)."""
    if not regression.direction:
        return verdict(_record(results, regression))
    outcome, detail = verdict(read_of(results, regression, version))
    if outcome is Outcome.NO_VERDICT:
        detail = write_failure(results, regression, version) or detail
    return outcome, detail


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


def verdict_line(regression: Regression | FailureSearch, search: Bisection, *, interrupted: bool = False) -> str:
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
    state = "reused" if step.get("reused") else "yes"
    return state + ("; interrupted" if step.get("interrupted") else "")


def _checkpoints(step: dict) -> str:
    """A direction step's checkpoints, as bisect.md's selection column adds them."""
    pairs = step.get("checkpoints")
    return f" ({'; '.join(f'written by {w}, read by {r}' for w, r in pairs)})" if pairs else ""


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
                "cells": failure.cells,
                "direction": regression.direction,
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
            for failure, line in zip(searches, lines)
            for regression, search in [(failure.regressions[0], failure.bisection)]
        ],
    }
    file_writes.write_text(out / f"{REPORT_NAME}.json", json.dumps(data, indent=2) + "\n")
    markdown = [
        "# torch bisect",
        "",
        f"{count(steps.count, 'step')} in {format_seconds(data['seconds'])}"
        + (f", regressions of run {request.from_run.name}" if request.from_run else "")
        + ("; interrupted: what was decided before the signal" if interrupted else ""),
        "",
        *(f"- {line}" for line in lines),
        "",
        "| step | torch | installed | selection | seconds |",
        "|---|---|---|---|---|",
        *(
            f"| {i} | {s['version']} | {_step_state(s)} | `{shlex.join(s['selection'])}`{_checkpoints(s)} | {s['seconds']:.0f} |"
            for i, s in enumerate(steps.log, 1)
        ),
    ]
    text = without_machine_paths("\n".join(markdown) + "\n", out, request.matrix.root)
    file_writes.write_text(out / f"{REPORT_NAME}.md", text)


def _since(begun: float) -> float:
    return round(time.time() - begun, 1)
