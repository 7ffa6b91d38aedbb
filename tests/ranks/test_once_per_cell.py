"""once_per_cell: a value computed once per (suite, cell) serves the cell's later tests, and a
computation that raised fails them at once under its own root cause, so the reports group the
whole cell with the failure that broke it instead of leading with "failed in an earlier test"."""

from __future__ import annotations

import re

import pytest

from helpers.matrix_files import matrix_toml
from helpers.run_results import cell_failures

pytestmark = pytest.mark.slow

SUITE = """
COMPUTED = []


def _shared():
    COMPUTED.append(1)
    return len(COMPUTED)


def _broken():
    raise ValueError("the stack broke")


def test_first_computes(cell, once_per_cell):
    assert once_per_cell("shared", _shared) == 1


def test_second_reuses(cell, once_per_cell):
    assert once_per_cell("shared", _shared) == 1


def test_broken_first(cell, once_per_cell):
    once_per_cell("broken", _broken)


def test_broken_later(cell, once_per_cell):
    once_per_cell("broken", _broken)


def test_broken_last(cell, once_per_cell):
    once_per_cell("broken", _broken)
"""


def test_a_failed_computation_fails_the_later_tests_under_its_own_root_cause(project):
    project.write("matrix.toml", matrix_toml(axes={"world_size": [1]}, suites={"shared": {}}))
    project.write("suites/test_shared.py", SUITE)
    done = project.torchmatrix("run", "--torch", "system", "--reports", "out", "--confirm-limit", "0")
    assert done.returncode == 1, done.stdout + done.stderr
    failures = cell_failures(project.root / "out" / "latest" / "torch-system")["ws1"]
    assert set(failures) == {"test_broken_first", "test_broken_later", "test_broken_last"}, failures
    for later in ("test_broken_later", "test_broken_last"):
        assert "ws1: broken failed in an earlier test of this cell: ValueError: the stack broke" in failures[later]
    causes = done.stdout[done.stdout.index("failures by root cause") :]
    assert re.search(r"3 tests in 1 cell, torch system: ValueError: the stack broke", causes), causes
    assert "earlier test" not in causes, causes
