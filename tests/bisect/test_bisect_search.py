"""The bisection over releases, without installing anything: order of steps, skips, stops, and
the versions `pip index versions torch` offers between two pins."""

from __future__ import annotations

import math

import pytest

from torchmatrix.bisect.command import (
    BisectError,
    Regression,
    bisect_selection,
    next_batch,
    regressions_of_run,
    verdict_line,
)
from torchmatrix.bisect.failures import FailureSearch
from torchmatrix.bisect.search import Bisection, Outcome
from torchmatrix.bisect.versions import VersionError, between, listed_versions
from torchmatrix.reports.run_reader import load_results

from helpers.report_runs import write_fixture_run

LISTING = """torch (2.15.0)
Available versions: 2.15.0, 2.14.1, 2.14.0, 2.13.0+cpu, 2.13.0, 2.12.1, 2.12.0
"""


def search_until_done(search: Bisection, first_bad: str, broken: frozenset[str] = frozenset()) -> list[str]:
    """Drive the search against a release line whose first bad release is `first_bad`."""
    index = search.candidates.index(first_bad) if first_bad in search.candidates else len(search.candidates)
    tried = []
    while (version := search.next_version()) is not None:
        tried.append(version)
        if version in broken:
            search.record(version, Outcome.NOT_INSTALLED, "no wheel")
        else:
            bad = search.candidates.index(version) >= index
            search.record(version, Outcome.FAILS if bad else Outcome.PASSED, "AssertionError: x" if bad else "")
    return tried


@pytest.mark.parametrize("count", [1, 2, 3, 7, 8, 20])
def test_every_first_bad_is_found_in_at_most_log2_steps(count):
    releases = [f"1.{i}.0" for i in range(count)]
    for first_bad in [*releases, "9.0.0"]:
        search = Bisection("0.1.0", "9.0.0", releases)
        tried = search_until_done(search, first_bad)
        assert search.first_bad == first_bad
        assert len(tried) <= math.ceil(math.log2(count + 1))


def test_a_release_that_does_not_install_is_stepped_around():
    releases = ["2.91.0", "2.92.0", "2.93.0"]
    search = Bisection("2.90.0", "2.94.0", releases)
    tried = search_until_done(search, "2.94.0", broken=frozenset({"2.92.0"}))
    assert tried == ["2.92.0", "2.93.0"]
    assert (search.last_good, search.first_bad, search.untested_between) == ("2.93.0", "2.94.0", [])


def test_an_uninstallable_neighbour_of_the_first_bad_makes_the_answer_a_range():
    search = Bisection("2.90.0", "2.94.0", ["2.91.0", "2.92.0", "2.93.0"])
    search_until_done(search, "2.93.0", broken=frozenset({"2.92.0"}))
    regression = Regression("s", "t", "ws1", {}, "2.90.0", "2.94.0", "AssertionError: y")
    line = verdict_line(regression, search)
    assert (
        line
        == "s::t [ws1]: first bad: one of 2.92.0, 2.93.0 (2.91.0 passed; 2.92.0 did not install: no wheel) — AssertionError: x"
    )


def test_a_flaky_release_ends_the_search_without_an_answer():
    search = Bisection("2.90.0", "2.98.0", [f"2.9{i}.0" for i in range(1, 8)])
    version = search.next_version()
    search.record(version, Outcome.FLAKY, "failed, then passed alone")
    assert search.next_version() is None
    line = verdict_line(Regression("s", "t", "ws1", {}, "2.90.0", "2.98.0", "E"), search)
    assert "first bad" not in line and f"no verdict: torch {version} flaky" in line


def test_failures_of_one_cell_that_ask_for_the_same_release_share_a_step():
    def search(test, cell):
        regression = Regression("s", test, cell, {"world_size": cell[-1]}, "2.90.0", "2.94.0", f"E {test}")
        return FailureSearch([regression], Bisection("2.90.0", "2.94.0", ["2.91.0", "2.92.0", "2.93.0"]))

    searches = [search(t, c) for t, c in [("a", "ws1"), ("b", "ws2"), ("c", "ws1")]]
    assert [s.regressions[0].test for s in next_batch(searches)] == ["a", "c"]
    searches[2].bisection.record("2.92.0", Outcome.FAILS, "E")
    assert [s.regressions[0].test for s in next_batch(searches)] == ["a"]
    judged = [searches[0].regressions[0], searches[2].regressions[0]]
    assert bisect_selection(judged, []) == ["--only=world_size=1", "--test=s::a", "--test=s::c"]


def test_listing_drops_local_labels_and_keeps_what_lies_between_the_pins():
    offered = listed_versions(LISTING)
    assert offered == ["2.15.0", "2.14.1", "2.14.0", "2.13.0", "2.12.1", "2.12.0"]
    assert between("2.13.0", "2.15.0", offered) == ["2.14.0", "2.14.1"]
    assert between("2.13.0", "2.15.0", [*offered, "2.15.0.dev20260101"]) == ["2.14.0", "2.14.1", "2.15.0.dev20260101"]


def test_pins_in_the_wrong_order_are_refused():
    with pytest.raises(VersionError, match="not older than"):
        between("2.15.0", "2.13.0", [])
    with pytest.raises(VersionError, match="not a torch version"):
        between("latest", "2.13.0", [])


def test_a_runs_confirmed_regressions_are_what_from_run_bisects(tmp_path):
    results = load_results(write_fixture_run(tmp_path / "project"))
    regressions = regressions_of_run(results)
    assert [(r.suite, r.test, r.cell, r.good, r.bad) for r in regressions] == [
        ("alpha", "test_regress", "ws2-fsdp2", "2.13.0", "2.14.1")
    ]
    assert regressions[0].axes == {"world_size": "2", "fsdp": "fsdp2"}
    assert bisect_selection(regressions, []) == [
        "--only=world_size=2",
        "--only=fsdp=fsdp2",
        "--test=alpha::test_regress",
    ]


def test_a_run_without_a_confirmed_regression_is_refused(tmp_path):
    results = load_results(write_fixture_run(tmp_path / "project", versions=("2.13.0",)))
    with pytest.raises(BisectError, match="no confirmed regression"):
        regressions_of_run(results)
