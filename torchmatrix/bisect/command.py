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

import math
import os
import shlex
import shutil
import sys
import time

from torchmatrix.bisect.commit_range import commit_range_line
from torchmatrix.bisect.directions import (
    broken_directions,
    direction_step,
    pins_step,
    read_of,
    write_failure,
)
from torchmatrix.bisect.failures import FailureSearch, cell_selection, grouped
from torchmatrix.bisect.regression import Regression
from torchmatrix.bisect.report import REPORT_NAME, write_report
from torchmatrix.bisect.request import BisectError, BisectRequest
from torchmatrix.bisect.search import Bisection, Outcome
from torchmatrix.bisect.steps import Steps
from torchmatrix.bisect.versions import VersionError, offered_versions
from torchmatrix.env.channel_install import IndexUnlisted
from torchmatrix.env.envdir_lock import EnvdirBusy, EnvdirUnlockable, lock_envdir
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.cells import Cell
from torchmatrix.messages.cross_version import SUITE, writer_of_read
from torchmatrix.reports.machine_paths import without_machine_paths
from torchmatrix.reports.records import RunResults, TestRecord
from torchmatrix.reports.run_reader import load_results
from torchmatrix.reports.upgrade_diff import upgrade_diffs
from torchmatrix.run.interrupts import Interrupts
from torchmatrix.run.progress import format_seconds
from torchmatrix.run.run_directory import new_run_id
from torchmatrix.status import Confirmation, Status, count


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
    write_report(out, request, searches, lines, steps, interrupted=interrupted)
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
