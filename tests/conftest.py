"""Fixtures the runner's tests share, and the order they start in (tests/helpers/start_order.py);
the helpers they import are in tests/helpers/."""

from __future__ import annotations

import os

import pytest

from torchmatrix.messages.compile_store import STORE_VARIABLE

from helpers import cli_forks
from helpers.checkout import checkout_env
from helpers.projects import Project
from helpers.report_runs import write_fixture_run
from helpers.start_order import expected_cost_rank

pytest_plugins = ["helpers.cpu_seconds"]


@pytest.fixture
def project(tmp_path) -> Project:
    return Project(tmp_path / "project")


@pytest.fixture
def run_dir(tmp_path):
    """The report tests' crafted run directory (helpers/report_runs.py): two torch versions, every status."""
    return write_fixture_run(tmp_path / "project")


@pytest.fixture(scope="session", autouse=True)
def compile_store(tmp_path_factory):
    """Every run the tests start caches its compiled graphs in one store of this test session, shared by
    its xdist workers, never the user's: a test that compiles what an earlier one did reuses it, as a
    user's next run does (the store's keys keep a mutant's graphs apart from its control's)."""
    base = tmp_path_factory.getbasetemp()
    store = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "compile-store"
    before = os.environ.get(STORE_VARIABLE)
    os.environ[STORE_VARIABLE] = str(store)
    yield store
    if before is None:
        del os.environ[STORE_VARIABLE]
    else:
        os.environ[STORE_VARIABLE] = before


@pytest.fixture(scope="session", autouse=True)
def shared_cli_server(compile_store):
    """The server Project.torchmatrix runs its commands in (helpers/cli_forks.py), for those in the
    session's environment, the compile store's variable included; stopped with the session."""
    cli_forks.shared = cli_forks.SharedServer(checkout_env())
    yield cli_forks.shared
    cli_forks.shared.close()
    cli_forks.shared = None


def pytest_collection_modifyitems(config, items):
    """The longest files first, then the other slow tests, then the fast lane's: under `--dist
    loadscope --no-loadscope-reorder` (nox -s tests) each file goes whole to one worker in this order,
    so a module-scoped run is made once and the short files fill the workers' tails."""
    items.sort(key=expected_cost_rank)
