"""The exit-code reference: docs/reference/exit-codes.md is what torchmatrix/exit_codes.py renders,
every command has its rows, and every row names tests that exist and provoke it."""

from __future__ import annotations

import subprocess
import sys

from torchmatrix.cli import build_parser
from torchmatrix.exit_code_table import EXIT_CODES, render_markdown
from torchmatrix.reports.upgrade_diff import BROKEN_DIRECTION, FAIL_CAUSES

from helpers.checkout import REPO, checkout_env

PAGE = REPO / "docs" / "reference" / "exit-codes.md"


def test_the_page_is_what_the_table_renders():
    assert PAGE.read_text() == render_markdown(), "regenerate: python -c 'from torchmatrix.exit_code_table import ...'"


def test_every_command_has_its_success_and_usage_rows():
    commands = set(build_parser()._subparsers._group_actions[0].choices)
    rows = {(row.command, row.code) for row in EXIT_CODES}
    for command in commands:
        assert (command, 0) in rows and (command, 2) in rows, command
    assert {row.command for row in EXIT_CODES} == commands | {"every command"}


def _collected(node_ids: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", *node_ids],
        cwd=REPO,
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_row_names_tests_that_exist():
    node_ids = sorted({node for row in EXIT_CODES for node in row.provoked_by})
    done = _collected(node_ids)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    listed = [line for line in done.stdout.splitlines() if "::" in line]
    unmatched = [node for node in node_ids if not any(line == node or line.startswith(f"{node}[") for line in listed)]
    assert unmatched == [], unmatched


def test_a_row_naming_a_test_that_does_not_exist_fails_the_check():
    done = _collected(["tests/hostile/test_corpus.py::test_hostile_input_is_refused_with_one_line[no-such-case]"])
    assert done.returncode != 0


def causes_without_a_row(rows) -> list[str]:
    """The causes compare exits 1 on that no `compare` exit-1 row states, each with a test."""
    stated = {row.meaning for row in rows if row.command == "compare" and row.code == 1 and row.provoked_by}
    return [cause.name for cause in FAIL_CAUSES if cause.meaning not in stated]


def test_every_cause_compare_exits_1_on_is_a_row_of_its_own():
    assert causes_without_a_row(EXIT_CODES) == []
    assert sum(row.command == "compare" and row.code == 1 for row in EXIT_CODES) == len(FAIL_CAUSES)


def test_a_cause_left_out_of_the_table_is_caught():
    rows = [row for row in EXIT_CODES if row.meaning != BROKEN_DIRECTION.meaning]
    assert causes_without_a_row(rows) == [BROKEN_DIRECTION.name]
