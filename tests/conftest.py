"""Fixtures the runner's tests share, and the order they start in (tests/helpers/start_order.py);
the helpers they import are in tests/helpers/."""

from __future__ import annotations

import pytest

from helpers.projects import Project
from helpers.start_order import expected_cost_rank

pytest_plugins = ["helpers.cpu_seconds"]


@pytest.fixture
def project(tmp_path) -> Project:
    return Project(tmp_path / "project")


def pytest_collection_modifyitems(config, items):
    """The longest files first, then the other slow tests, then the fast lane's: under `--dist
    loadscope --no-loadscope-reorder` (nox -s tests) each file goes whole to one worker in this order,
    so a module-scoped run is made once and the short files fill the workers' tails."""
    items.sort(key=expected_cost_rank)
