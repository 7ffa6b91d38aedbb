"""A test that never reached its end (pytest.exit() or KeyboardInterrupt in it, which pytest
re-raises without a report of the phase it cut short) is an error, never a pass; the reports pytest
does write are folded as before."""

from __future__ import annotations

import pytest
from _pytest.outcomes import Exit
from _pytest.reports import TestReport

from torchmatrix.ranks.plugin import _outcome


def report(when: str, outcome: str = "passed") -> TestReport:
    longrepr = ("suite.py", 1, "Skipped: no GPU") if outcome == "skipped" else None
    return TestReport("suite.py::test_x[ws1]", ("suite.py", 1, "test_x"), {}, outcome, longrepr, when)


def test_a_test_that_ran_every_phase_passes():
    assert _outcome([report("setup"), report("call"), report("teardown")])["status"] == "passed"


def test_a_skip_in_setup_is_a_skip():
    folded = _outcome([report("setup", "skipped"), report("teardown")])
    assert (folded["status"], folded["message"]) == ("skipped", "no GPU")


@pytest.mark.parametrize(
    "stopped, says",
    [(Exit("leaving early", returncode=0), "Exit: leaving early"), (KeyboardInterrupt(), "KeyboardInterrupt stopped")],
    ids=["pytest.exit", "KeyboardInterrupt"],
)
def test_a_test_stopped_in_its_call_is_an_error(stopped, says):
    folded = _outcome([report("setup")], stopped=stopped)
    assert folded["status"] == "error" and says in folded["message"], folded
    assert folded["message"].startswith("the test never reached its end: ")


def test_a_test_stopped_in_its_setup_has_no_report_and_is_an_error():
    assert _outcome([], stopped=KeyboardInterrupt())["status"] == "error"


def test_a_test_without_a_teardown_report_is_an_error_even_unexplained():
    folded = _outcome([report("setup"), report("call")])
    assert folded["status"] == "error" and "no call or teardown" in folded["message"]


def test_a_failure_before_the_stop_stays_a_failure():
    failed = report("call", "failed")
    failed.longrepr = "AssertionError: boom"
    assert _outcome([report("setup"), failed], stopped=Exit("bye"))["status"] == "failed"
