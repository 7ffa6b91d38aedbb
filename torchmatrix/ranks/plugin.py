"""The pytest plugin the runner loads into each suite process (`-p torchmatrix.ranks.plugin`).

It parametrizes every suite test by the cells planned for it, enforces the per-test deadline
through the rank pool, and streams each result to the event log the runner turns into JUnit; the
fixtures tests ask for and the skips decided before a test starts are its two companions
(`fixtures`, `component_skips`), which it loads.
"""

from __future__ import annotations

import faulthandler
import fnmatch
import json
import os
import signal
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest

from torchmatrix import file_writes
from torchmatrix.components.compile_axis import DEFAULT_BACKEND, compile_backends, graphs_kept
from torchmatrix.forks import zygote
from torchmatrix.forks.parent_death import exit_with_runner
from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.plan import run_key
from torchmatrix.matrix.suite_options import SuiteOptions
from torchmatrix.matrix.suite_selection import selects, unmatched_test_message, unmatched_tests
from torchmatrix.messages import compile_keys, compile_store
from torchmatrix.messages.events import (
    Collected,
    CollectError,
    EventLog,
    PoolStarted,
    TestFinished,
    TestStarted,
    stacks_path,
)
from torchmatrix.messages.grant import Grant
from torchmatrix.messages.group_plan import GroupPlan
from torchmatrix.messages.output_cap import DEFAULT_CAP_BYTES, cap_text
from torchmatrix.messages.properties import COMPILE_SECONDS, COMPILE_SECONDS_SAVED, CPU_SECONDS, WARNING_PROPERTY
from torchmatrix.messages.root_cause import root_cause
from torchmatrix.ranks import compiler_warmup
from torchmatrix.ranks.compile_ledger import compile_seconds_saved, has_compiled
from torchmatrix.ranks.compile_time import compile_seconds
from torchmatrix.ranks.known_failure_memo import (
    RECALLED,
    recalled_property,
    recalled_reason,
    record_failure,
    recorded_failure,
)
from torchmatrix.ranks.launched import launched_rank
from torchmatrix.ranks.memory_peaks import largest
from torchmatrix.ranks.per_test_usage import (
    Usage,
    as_entries,
    module_of,
    normalised,
    rank_usage,
)
from torchmatrix.ranks.pool import RankFailure
from torchmatrix.ranks.rank_group import RankGroup, open_ranks
from torchmatrix.ranks.run_order import running_order
from torchmatrix.ranks.simulation_limits import as_simulation_limit
from torchmatrix.ranks.suite_temp_root import keep_tmp_paths_apart
from torchmatrix.ranks.worker import COMPILE_CACHE_VARIABLE
from torchmatrix.status import Status

PLAN_KEY = pytest.StashKey["CellPlan"]()
USAGE_QUERY_SECONDS = 30.0
pytest_plugins = ("torchmatrix.ranks.fixtures", "torchmatrix.ranks.component_skips")
NOT_PLANNED = "suites run through `python -m torchmatrix run`, which tells this plugin the cells to run"


def compile_cache_root(plan: GroupPlan, rootpath: Path) -> Path:
    """Where this process's compile caches live: the compile store's folder for this torch build, its
    sources and the matrix's (`compile_keys`), which every later run with the same key reuses; else
    `compile-cache` in the run's directory for the version (the parent of its logs/), so every pytest
    process of the version's run, confirmation re-runs included, finds what the earlier ones compiled."""
    if plan.compile_store is None:
        return compile_store.run_folder(Path(plan.events).parent.parent)
    facts = compile_keys.key_facts(
        matrix_digest=plan.compile_store.matrix_digest,
        device=plan.device.to_json(),
        components=plan.components,
        suite_files=[rootpath / spec.path for spec in plan.suites.values()],
    )
    return compile_store.key_folder(Path(plan.compile_store.root), facts)


def pytest_addoption(parser):
    parser.addoption(
        "--torchmatrix-plan", metavar="PLAN.json", help="cells and suites for this process (written by the runner)"
    )


def pytest_configure(config):
    path = config.getoption("--torchmatrix-plan")
    if path:
        exit_with_runner()
        keep_tmp_paths_apart()
        plan = CellPlan(GroupPlan.read(Path(path)), Path(config.rootpath))
        config.stash[PLAN_KEY] = plan
        config.pluginmanager.register(plan, "torchmatrix-plan")


class CellPlan:
    """One process's share of the matrix: a world size, its suite runs, and their ranks.

    The ranks (a RankGroup) are built once the runner's grant arrives: a local pool, or, when an
    external launcher started this process as one rank of a multi-node world, this process
    itself (only rank 0 writes the event log the runner reads).
    """

    def __init__(self, plan: GroupPlan, rootpath: Path):
        self.plan = plan
        self.rootpath = rootpath
        self.suites = plan.suites
        self.optional = plan.optional
        self.suite_by_path = {(rootpath / spec.path).resolve(): name for name, spec in self.suites.items()}
        self.cells_by_suite: dict[str, list[Cell]] = {}
        for suite, cell in plan.runs:
            self.cells_by_suite.setdefault(suite, []).append(cell)
        self.order = {run_key(suite, cell.id): i for i, (suite, cell) in enumerate(plan.runs)}
        self.only_tests = {key: set(names) for key, names in plan.only_tests.items()}
        self.pool: RankGroup | None = None
        self.worlds: dict[int, RankGroup] = {}
        rank = launched_rank() if plan.launched else 0
        if rank == 0:  # what held this process, should it not collect or not exit in time (run/schedule.py)
            self._stacks = file_writes.open_stream(stacks_path(plan.events))  # faulthandler writes to its fd
            faulthandler.register(signal.SIGUSR1, file=self._stacks, all_threads=True)
        self.compile_caches = compile_cache_root(plan, rootpath)
        self.running_order = running_order(plan.runs, self.compiles_cold)
        self._stamped: set[str] = set()
        if not plan.launched:
            backends = frozenset().union(*(compile_backends(cell) for _, cell in plan.runs))
            if backends:
                compiler_warmup.warm_up(
                    self.compile_caches / compile_store.PROBE_FOLDER,
                    cache_variable=COMPILE_CACHE_VARIABLE,
                    device_type=plan.device_type,
                    inductor=DEFAULT_BACKEND in backends,
                )
            zygote.start()
        self.events = EventLog(plan.events if rank == 0 else f"{plan.events}.rank{rank}")
        self._reports: dict[str, list] = {}
        self.shared: dict[tuple[str, str, str], object] = {}

    def compile_cache(self, cell: Cell) -> str:
        """The directory torch.compile caches into while a suite runs on this cell (a folder per rank
        in it): one per cell of this torch version, which every suite, test and confirmation re-run of
        the cell reuses, so no compiled kernel crosses cells or versions."""
        folder = self.compile_caches / cell.id  # checked as a file name when the plan was read
        if self.plan.compile_store is not None and cell.id not in self._stamped:
            compile_store.mark_used(folder)
            self._stamped.add(cell.id)
        return str(folder)

    def compiles_cold(self, cell: Cell) -> bool:
        """Whether the store keeps what the cell compiles (`graphs_kept`) and none of its tests has
        compiled under this process's key before, so its graphs are not in the store (another backend's
        cell costs a warm run what it costs a cold one, and keeps its place). Never for a launched rank
        (torchrun, srun): each orders its tests on its own node, whose store may differ, and all must
        run them in one order, the plan's."""
        if self.plan.launched:
            return False
        return graphs_kept(cell) and not has_compiled(self.compile_caches / cell.id)

    def suite_of(self, path: Path) -> str | None:
        return self.suite_by_path.get(Path(path).resolve())

    def pytest_generate_tests(self, metafunc):
        suite = self.suite_of(metafunc.definition.path)
        if suite is None:
            return
        if "cell" not in metafunc.fixturenames:
            raise pytest.UsageError(
                f"{metafunc.definition.nodeid}: every suite test must take the `cell` (or `ranks`) fixture, so its result belongs to a cell"
            )
        cells = self.cells_by_suite.get(suite, [])
        metafunc.parametrize("cell", cells, ids=[c.id for c in cells])

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        """Run cell by cell (in plan order, cells about to compile cold first: `run_order`) so results
        of whole cells arrive early; a run the plan narrows (`--test`, a confirmation) keeps only the
        tests it names, and each name that matches none of the run's tests is an error of the run
        naming the tests it has."""
        names_by_run: dict[str, list[str]] = {}
        for item in items:
            names_by_run.setdefault(self._key(item), []).append(test_name(item))
        if self.only_tests:
            kept = [item for item in items if self.keeps(item)]
            config.hook.pytest_deselected(items=[item for item in items if item not in kept])
            items[:] = kept
        for item in items:
            self.mark_known_failure(item)
        items.sort(key=lambda item: self.running_order.get(self._key(item), len(self.order)))
        collected: dict[str, list[str]] = {key: [] for key in self.order}
        for item in items:
            key = self._key(item)
            if key in collected:
                collected[key].append(test_name(item))
        unmatched = {
            key: unmatched_tests(names, names_by_run.get(key, ()))
            for key, names in self.only_tests.items()
            if key in collected
        }
        for key, names in unmatched.items():
            collected[key].extend(names)
        self.events.write(Collected(collected))
        for key, names in unmatched.items():
            suite, cell = self.plan.runs[self.order[key]]
            for name in names:
                message = unmatched_test_message(suite, name, names_by_run.get(key, ()))
                self.events.write(
                    TestFinished(nodeid="", suite=suite, cell=cell.id, test=name, status="error", message=message)
                )

    def keeps(self, item) -> bool:
        """Whether the plan keeps this collected test: every test of a run it does not narrow."""
        key = self._key(item)
        return key not in self.only_tests or any(selects(name, test_name(item)) for name in self.only_tests[key])

    def known_failure(self, item) -> str | None:
        """The reason of the `[[known_failure]]` entry that covers this test in its cell, if one does. A name
        written out with its parameters (`test_x[dropout=0.1]`) matches as written, not as a glob's `[...]` class."""
        name = test_name(item)
        globs = self.plan.known_failures.get(self._key(item), ())
        return next((reason for glob, reason in globs if name == glob or fnmatch.fnmatchcase(name, glob)), None)

    def mark_known_failure(self, item) -> None:
        """A known failure runs as a non-strict xfail: its failure reads "expected failure: <reason>",
        its pass is reported as one."""
        if (reason := self.known_failure(item)) is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=False))

    def failure_memo(self, item) -> Path | None:
        """The store folder that remembers how this test failed, for a known failure of a cell that
        compiles into a store that outlives the run (`known_failure_memo`). None for a launched rank,
        whose node's store may differ from the other ranks', which must all run the same tests."""
        cell = getattr(item, "callspec", None) and item.callspec.params.get("cell")
        if self.plan.compile_store is None or self.plan.launched or not isinstance(cell, Cell):
            return None
        return self.compile_caches / cell.id if compile_backends(cell) and self.known_failure(item) else None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        """A known failure its store folder saw fail is reported as that expected failure, not run again."""
        folder = self.failure_memo(item)
        if folder and (recorded := recorded_failure(folder, f"{self.suite_of(item.path)}::{test_name(item)}")):
            item.user_properties.append((RECALLED, recalled_property(recorded)))
            pytest.xfail(recalled_reason(self.known_failure(item)))

    def pytest_collection_finish(self, session):
        """Imports and collection are done; wait here until the runner grants GPUs and cores, then
        build the ranks from that grant and start them before the first test."""
        grant = Grant.wait(Path(self.plan.gate)) if self.plan.gate else Grant()
        if grant.gpus:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, grant.gpus))
        if grant.nice:
            os.nice(grant.nice)
        self.pool = open_ranks(self.plan, grant)
        if session.items:
            try:
                self.start_pool()
            except RankFailure:
                pass  # the first test's `ranks` fixture tries again and reports why, per test

    def start_pool(self) -> None:
        """Start the ranks if they are down (before the first test, so no test's time includes it)."""
        starts = self.pool.starts
        self.pool.start()
        if self.pool.starts != starts:
            self.events.write(PoolStarted(self.pool.world_size))

    def world(self, world_size: int) -> RankGroup:
        """The ranks of a world of `world_size` of their own beside the cell's (the cell's own ranks at
        its size), kept for this process's later tests: a reshard test runs each side in its own world."""
        if world_size == self.pool.world_size:
            return self.pool
        if world_size not in self.worlds:
            self.worlds[world_size] = self.pool.of_size(world_size)
        return self.worlds[world_size]

    def pytest_collectreport(self, report):
        suite = self.suite_of(Path(self.rootpath, report.nodeid.split("::")[0]))
        if report.failed:
            text = cap_text(str(report.longrepr), self.plan.output_cap)
            self.events.write(CollectError(suite, report.nodeid, text))
        elif report.skipped and suite is not None:
            self._skipped_suite(suite, report)

    def _skipped_suite(self, suite: str, report) -> None:
        """A suite module that skipped itself (`pytest.importorskip` at the top) is one skipped case
        per cell, so that the runner can tell it from a suite that collected no test."""
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        for cell in self.cells_by_suite.get(suite, []):
            where = {"suite": suite, "cell": cell.id, "test": suite}
            self.events.write(TestFinished(nodeid=report.nodeid, **where, status="skipped", message=reason))

    def pytest_runtest_logreport(self, report):
        self._reports.setdefault(report.nodeid, []).append(report)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        """Announce the test (so the runner can spot a hang), then record its combined outcome."""
        cell = getattr(item, "callspec", None) and item.callspec.params.get("cell")
        where = (
            {"suite": self.suite_of(item.path), "cell": cell.id, "test": test_name(item)}
            if isinstance(cell, Cell)
            else None
        )
        if where:
            self.events.write(TestStarted(**where, started=time.time()))
        before = self.usage() if where else None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            protocol = yield
        stopped = protocol.exception  # pytest.exit() or KeyboardInterrupt: pytest reports no phase it cut short
        reports = self._reports.pop(item.nodeid, [])
        own_warnings = Counter((w.category.__name__, module_of(w.filename), normalised(w.message)) for w in caught)
        if where and (reports or stopped is not None):
            outcome = as_simulation_limit(_outcome(reports, self.plan.output_cap, stopped), self.plan.device_type)
            after = self.usage() if before is not None else None
            if after is not None:
                if after.unread_ranks == before.unread_ranks:  # else a stopped rank's CPU is missing from it
                    outcome["properties"].append([CPU_SECONDS, round(after.cpu_seconds - before.cpu_seconds, 3)])
                if compiled := after.compiled_since(before):
                    outcome["properties"].append([COMPILE_SECONDS, round(compiled, 3)])
                    # Only the stored backends' graphs are on disk: elsewhere a difference is timing noise.
                    if self.plan.compile_store is not None and graphs_kept(cell):
                        folder = self.compile_caches / where["cell"]
                        saved = compile_seconds_saved(folder, f"{where['suite']}::{where['test']}", compiled)
                        if saved:
                            outcome["properties"].append([COMPILE_SECONDS_SAVED, round(saved, 3)])
                own_warnings.update(after.warnings)
                # Reset when read: `before` ended the previous test's window, `after` is this test's.
                outcome["properties"].extend([name, peak] for name, peak in (after.memory_peaks or {}).items())
            for index, entry in enumerate(as_entries(own_warnings), 1):
                outcome["properties"].append([f"{WARNING_PROPERTY}.{index}", json.dumps(entry)])
            self.events.write(TestFinished(nodeid=item.nodeid, **where, **outcome))
            # A known failure fails in its call or in a fixture it shares with the cell's other tests. A
            # rank that timed out or died says nothing a later run would repeat: only a raise is kept.
            failed = next((r for r in reports if r.skipped and hasattr(r, "wasxfail") and r.when != "teardown"), None)
            recalled = any(name == RECALLED for name, _ in item.user_properties)
            if failed is not None and not failed.interrupted and not recalled and (folder := self.failure_memo(item)):
                record_failure(folder, f"{where['suite']}::{where['test']}", failed.root_cause)
        if nextitem is not None and self.pool.starts and not self.pool.running:
            try:
                self.start_pool()  # the rebuild after a failure, timed as no test's
            except RankFailure:
                pass  # the next test's `ranks` fixture tries again and reports why

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        """Keep the failure's root cause line with its report (the rank's, for a RankFailure), an
        expected failure's included, and whether a rank timed out or died."""
        outcome = yield
        report = outcome.get_result()
        if call.excinfo is not None and (report.failed or hasattr(report, "wasxfail")):
            report.root_cause = root_cause(call.excinfo.value)
            report.interrupted = bool(getattr(call.excinfo.value, "interrupted", False))

    def pytest_sessionfinish(self, session):
        for world in self.worlds.values():
            world.close()
        if self.pool is not None:
            self.pool.close()
        self.events.close()

    def usage(self) -> Usage | None:
        """User + system CPU seconds this process and its local ranks (the cell's and those of the
        worlds beside it, running or stopped) have used so far (what a test costs whatever else loads
        the machine), the warnings the running ranks raised since the last call and each running rank
        of the cell's compile seconds; None before the cell's ranks first started."""
        own = sum(os.times()[:2])
        if self.plan.launched:
            return Usage(own, Counter(), (compile_seconds(),))
        if self.pool is None:
            return None
        groups = [self.pool, *self.worlds.values()]
        try:
            replies = [
                group.run(rank_usage, (), deadline=time.monotonic() + USAGE_QUERY_SECONDS) if group.running else []
                for group in groups
            ]
        except RankFailure:
            return None
        every_rank = [rank for reply in replies for rank in reply]
        raised = Counter()
        for rank in every_rank:
            raised.update({(w["category"], w["module"], w["message"]): w["count"] for w in rank["warnings"]})
        compiled = tuple(rank["compile_seconds"] for rank in replies[0])
        retired = sum(group.retired_cpu_seconds for group in groups)
        unread = sum(group.unread_ranks for group in groups)
        peaks = largest([rank["memory_peaks"] for rank in every_rank])
        return Usage(own + retired + sum(rank["cpu_seconds"] for rank in every_rank), raised, compiled, unread, peaks)

    def _key(self, item) -> str | None:
        cell = getattr(item, "callspec", None) and item.callspec.params.get("cell")
        suite = self.suite_of(item.path)
        return run_key(suite, cell.id) if suite and isinstance(cell, Cell) else None


def test_name(item) -> str:
    """The test's name within its cell: the function name plus any parameters other than the cell."""
    params = (
        {k: v for k, v in getattr(item, "callspec", None).params.items() if k != "cell"}
        if hasattr(item, "callspec")
        else {}
    )
    if not params:
        return item.originalname
    return f"{item.originalname}[{','.join(f'{k}={v}' for k, v in params.items())}]"


KNOWN_FAILURE_PASSED = "known_failure_passed"
"""The property a test covered by `[[known_failure]]` carries when it passed: the entry's reason."""


def _outcome(reports, cap: int = DEFAULT_CAP_BYTES, stopped: BaseException | None = None) -> dict:
    """Fold setup/call/teardown reports into one result the way JUnit reads it, each text capped
    at `cap` bytes (head and tail kept).

    A failing call is a failure; a failing setup or teardown is an error; a test that never
    reached its end (`stopped` by pytest.exit() or KeyboardInterrupt, or without a call or
    teardown report) is an error; otherwise a skip in any phase is a skip (with its reason);
    otherwise the test passed.
    """
    last = reports[-1] if reports else None
    result = {
        "duration": sum(r.duration for r in reports),
        "properties": [list(p) for p in last.user_properties] if last else [],
        "stdout": cap_text(last.capstdout, cap) if last else "",
        "stderr": cap_text(last.capstderr, cap) if last else "",
        "status": Status.PASSED.value,
        "message": "",
        "text": "",
    }
    failed = [r for r in reports if r.failed]
    skipped = [r for r in reports if r.skipped]
    phases = {r.when for r in reports}
    if not failed and (stopped is not None or "teardown" not in phases or not (skipped or "call" in phases)):
        result.update(status=Status.ERROR.value, message=cap_text(_unfinished(stopped), cap))
    elif failed:
        first = failed[0]
        crash = getattr(first.longrepr, "reprcrash", None)
        text = first.longreprtext
        fallback = crash.message if crash is not None else (text.strip().splitlines() or [Status.FAILED.value])[-1]
        result.update(
            status=(Status.FAILED if first.when == "call" else Status.ERROR).value,
            message=cap_text(getattr(first, "root_cause", None) or fallback, cap),
            text=cap_text(text, cap),
        )
    elif passed_known_failure := next((r for r in reports if r.passed and hasattr(r, "wasxfail")), None):
        result["message"] = (
            f"known failure passed: {passed_known_failure.wasxfail}; if a release fixed it, narrow or remove its "
            "[[known_failure]] entry"
        )
        result["properties"].append([KNOWN_FAILURE_PASSED, passed_known_failure.wasxfail])
    elif skipped:
        first = skipped[0]
        if hasattr(first, "wasxfail"):
            reason = f"expected failure: {first.wasxfail}"
        else:
            reason = first.longrepr[2] if isinstance(first.longrepr, tuple) else str(first.longrepr)
        result.update(status=Status.SKIPPED.value, message=reason.removeprefix("Skipped: "))
    return result


def _unfinished(stopped: BaseException | None) -> str:
    """Why a test that never reached its end is an error, never a pass."""
    if stopped is None:
        return "the test never reached its end: pytest reported no call or teardown for it"
    raised = f"{type(stopped).__name__}: {stopped}" if str(stopped) else type(stopped).__name__
    return (
        f"the test never reached its end: {raised} stopped the pytest session there "
        "(a test that calls pytest.exit() or raises KeyboardInterrupt is an error, never a pass)"
    )


def planned_options(config, path) -> SuiteOptions | dict:
    """The options the runner planned for the suite at `path` in this pytest process (a built-in suite's
    dataclass, else the table), for a suite module's own pytest_generate_tests (fixtures are not available at collection)."""
    plan = config.stash[PLAN_KEY]
    suite = plan.suite_of(path)
    return plan.suites[suite].options if suite else {}
