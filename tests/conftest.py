"""Fixtures the runner's tests share; the helpers they import are in tests/helpers/."""

from __future__ import annotations

import pytest

from helpers.projects import Project


@pytest.fixture
def project(tmp_path) -> Project:
    return Project(tmp_path / "project")
