"""The fixtures a suite test asks for: its `cell`, the `ranks` that run it, its `suite_options` and
`components`, pytest's `tmp_path` shared by a launcher's ranks, and `once_per_cell`."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchmatrix.matrix.suite_options import SuiteOptions
from torchmatrix.messages.root_cause import root_cause
from torchmatrix.ranks.cell_ranks import Ranks
from torchmatrix.ranks.plugin import NOT_PLANNED, PLAN_KEY, CellPlan


@pytest.fixture
def cell():
    """The cell this test runs for; the plugin parametrizes it, so reaching here is a misuse."""
    raise pytest.UsageError(NOT_PLANNED)


@pytest.fixture(scope="session")
def _cell_plan(request) -> CellPlan:
    plan = request.config.stash.get(PLAN_KEY, None)
    if plan is None:
        raise pytest.UsageError(NOT_PLANNED)
    return plan


@pytest.fixture
def ranks(request, cell, _cell_plan) -> Ranks:
    _cell_plan.start_pool()
    suite = _cell_plan.suite_of(request.node.path)
    timeout = _cell_plan.suites[suite].timeout
    return Ranks(_cell_plan.pool, cell, timeout, _cell_plan.compile_cache(cell), _cell_plan.world)


@pytest.fixture
def tmp_path(tmp_path, request):
    """pytest's tmp_path, except under a launcher: there every rank is its own pytest process, so
    all ranks share one directory that rank 0 makes next to the run's logs."""
    plan = request.config.stash.get(PLAN_KEY, None)
    if plan is None:
        return tmp_path
    return plan.pool.test_directory(tmp_path, Path(plan.plan.events).parent / "tmp", request.node.name)


@pytest.fixture
def suite_options(request, _cell_plan) -> SuiteOptions | dict:
    """The suite's `[suites.<name>.options]` from matrix.toml: a built-in suite's dataclass as the plan
    carries it; a suite of the user's own has its table read into the dataclass its module names as
    `OPTIONS`, else gets the table as it is."""
    options = _cell_plan.suites[_cell_plan.suite_of(request.node.path)].options
    if isinstance(options, SuiteOptions):
        return options
    declared = getattr(request.module, "OPTIONS", None)
    return declared.from_table(options) if declared else dict(options)


class _FailedEarlier:
    """What once_per_cell keeps for a computation that raised: later tests fail with this line,
    under the computation's own root cause, so reports group them with the failure that broke it, and
    saying whether a rank died or timed out in it (a known failure's memo keeps only a raise)."""

    def __init__(self, line: str, cause: str, interrupted: bool):
        self.line, self.cause, self.interrupted = line, cause, interrupted

    def fail(self):
        failure = pytest.fail.Exception(f"{self.line}: {self.cause}", pytrace=False)
        failure.root_cause = self.cause
        failure.interrupted = self.interrupted
        raise failure


@pytest.fixture
def once_per_cell(request, cell, _cell_plan):
    """`once_per_cell(name, compute)`: compute() the first time a test of this cell and suite asks,
    the same value for its later tests. A computation that raised fails those later tests at once,
    so a broken or hung cell costs one deadline, not one per test."""
    suite = _cell_plan.suite_of(request.node.path) or ""

    def shared(name: str, compute):
        key = (suite, cell.id, name)
        if key not in _cell_plan.shared:
            try:
                _cell_plan.shared[key] = compute()
            except BaseException as error:
                line = f"{cell.id}: {name} failed in an earlier test of this cell"
                interrupted = bool(getattr(error, "interrupted", False))
                _cell_plan.shared[key] = _FailedEarlier(line, root_cause(error), interrupted)
                raise
        value = _cell_plan.shared[key]
        if isinstance(value, _FailedEarlier):
            value.fail()
        return value

    return shared


@pytest.fixture
def components(_cell_plan) -> dict:
    """Import paths from matrix.toml `[components]`; resolve them with torchmatrix.testing.load."""
    return dict(_cell_plan.plan.components)
