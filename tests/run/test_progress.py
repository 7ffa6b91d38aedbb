"""The terminal line of a finished cell says what a newcomer would otherwise open results.json for."""

from __future__ import annotations

import io

from torchmatrix.run.progress import Progress, cell_outcome
from torchmatrix.status import Status


def test_a_passing_cell_counts_its_skips():
    tests = [(f"dtensor_optim::t{i}", Status.SKIPPED) for i in range(13)] + [
        (f"grad_ckpt::t{i}", Status.PASSED) for i in range(6)
    ]
    assert cell_outcome(tests) == "passed (19 tests, 13 skipped)"
    assert cell_outcome([("a::t", Status.PASSED)]) == "passed (1 tests)"
    assert cell_outcome([("a::t", Status.SKIPPED)]) == "skipped (1 tests)"


def test_a_failing_cell_names_its_first_failing_tests_then_how_many_more():
    tests = [
        ("g::ok", Status.PASSED),
        ("g::a", Status.FAILED),
        ("g::b", Status.ERROR),
        ("g::c", Status.FAILED),
        ("g::d", Status.FAILED),
        ("g::e", Status.FAILED),
    ]
    assert cell_outcome(tests) == "error (6 tests): g::a, g::b, g::c +2"
    assert cell_outcome(tests[:3]) == "error (3 tests): g::a, g::b"


def test_the_line_carries_the_outcome_and_totals():
    stream = io.StringIO()
    Progress("2.13.0", 2, stream).cell_finished(
        "ws1-none",
        [("g::a", Status.FAILED), ("g::b", Status.SKIPPED)],
        {"passed": 0, "failed": 1, "error": 0, "skipped": 1},
    )
    line = stream.getvalue()
    assert line.startswith("[1/2] torch 2.13.0 ws1-none: failed (2 tests, 1 skipped): g::a | 0 passed, 1 failed")


def test_a_read_pass_says_it_reads_so_its_count_is_not_taken_for_the_matrixs():
    """cross-read runs each version's reads through the runner: its `[k/N]` series says what it is."""
    stream = io.StringIO()
    Progress("2.13.0", 4, stream, reading=True).cell_finished(
        "ws1-none", [("cross_version::t", Status.PASSED)], {"passed": 1, "failed": 0, "error": 0, "skipped": 0}
    )
    assert stream.getvalue().startswith("[1/4] torch 2.13.0 reads ws1-none: passed (1 tests)")
