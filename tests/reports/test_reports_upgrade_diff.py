"""The torch-upgrade diff: inside one run (every version against the baseline) and across two runs."""

from __future__ import annotations

import math

import pytest

from torchmatrix.matrix.config import ReportSettings
from torchmatrix.reports.records import TestRecord
from torchmatrix.reports.report import load_run
from torchmatrix.reports.upgrade_diff import CompareError, compare_runs, diff_records, grew, upgrade_diffs

from helpers.matrix_files import write_matrix
from helpers.projects import Project
from helpers.report_runs import (
    BASELINE,
    CANDIDATE,
    MATRIX,
    write_fixture_run,
    write_single_version_run,
)


def summary(changes):
    return sorted((c.after.suite, c.after.test, c.after.run_cell, len(c.cells)) for c in changes)


def test_every_kind_of_change_between_baseline_and_candidate(tmp_path):
    [diff] = upgrade_diffs(load_run(write_fixture_run(tmp_path)))
    assert (diff.before, diff.after) == (BASELINE, CANDIDATE)
    assert summary(diff.regressions) == [("alpha", "test_regress", "ws2-fsdp2", 1)]
    assert summary(diff.fixes) == [("alpha", "test_fixed", "ws1-none", 1)]
    assert summary(diff.unconfirmed) == [("alpha", "test_flaky", "ws1-fsdp2", 1)], "it passed alone"
    assert summary(diff.newly_skipped) == [
        ("alpha", "test_divide", "ws2-none", 1),
        ("beta", "test_skipped", "ws1-none", 2),
        ("beta", "test_skipped", "ws2-none", 2),
    ], "a test that now hits a CPU-simulation limit checks nothing, as a skipped one: never a regression"
    assert [(d.test, d.cell, d.figure, d.before, d.after) for d in diff.drift] == [
        ("test_drift[0.0]", "ws2-fsdp2", "grad_max_abs/layer0.w", 1e-9, 1e-6)
    ]
    assert [(s.suite, s.before, s.after, s.tests, s.median_ratio) for s in diff.slowdowns] == [
        ("beta", 6.5, 18.5, 7, 3.0)
    ]
    assert diff.compared == 6 * 4 + 5 * 2, "alpha: 6 tests x 4 cells; beta: 5 tests x 2 representative cells"


def _failing(confirmation: str) -> TestRecord:
    return TestRecord("2.14.1", "ws1", "s", "t", "failed", 1.0, "RuntimeError: x", confirmation=confirmation)


@pytest.mark.parametrize(
    ("confirmation", "regressions", "unconfirmed", "clean"),
    [
        ("fails alone", 1, 0, False),
        ("passed alone", 0, 1, True),  # order-dependent: listed, does not fail `compare`
        ("not re-run", 0, 1, False),  # past the limit: unknown, so `compare` cannot call it clean
        ("", 0, 1, False),  # confirmation switched off
    ],
)
def test_only_confirmed_failures_are_regressions(confirmation, regressions, unconfirmed, clean):
    diff = diff_records([record("passed")], [_failing(confirmation)], ReportSettings(), "a", "b")
    assert (len(diff.regressions), len(diff.unconfirmed), diff.clean) == (regressions, unconfirmed, clean)


def test_a_fix_needs_the_baselines_failure_confirmed():
    confirmed = diff_records([_failing("fails alone")], [record("passed")], ReportSettings(), "a", "b")
    flaky = diff_records([_failing("passed alone")], [record("passed")], ReportSettings(), "a", "b")
    assert (len(confirmed.fixes), len(flaky.fixes), len(flaky.unconfirmed)) == (1, 0, 1)


def timed(durations):
    return [TestRecord("v", "ws1", "s", f"t{i}", "passed", d) for i, d in enumerate(durations)]


@pytest.mark.parametrize(
    ("before", "after", "flagged"),
    [
        ([2.0, 2.0, 2.0, 2.0], [6.0, 6.0, 6.0, 6.0], True),  # every test 3x slower, +16 s
        ([2.0, 2.0, 2.0, 2.0], [20.0, 2.0, 2.0, 2.0], False),  # one test hit by noise: the median did not move
        ([0.1] * 30, [0.9] * 30, False),  # tests too short to time (under 0.5 s each)
        ([1.0, 1.0, 1.0], [2.5, 2.5, 2.5], False),  # 2.5x, but only 4.5 s in all
        ([3.0, 3.0], [9.0, 9.0], False),  # fewer than three timed tests
    ],
)
def test_a_slowdown_is_flagged_only_beyond_noise(before, after, flagged):
    diff = diff_records(timed(before), timed(after), ReportSettings(slowdown_ratio=1.5), "a", "b")
    assert bool(diff.slowdowns) is flagged


def test_a_shared_result_is_one_change_that_names_every_cell_it_stands_for(tmp_path):
    [diff] = upgrade_diffs(load_run(write_fixture_run(tmp_path)))
    change = next(c for c in diff.newly_skipped if c.after.run_cell == "ws1-none")
    assert change.cells == ("ws1-none", "ws1-fsdp2")


def test_thresholds_are_the_runs_own_or_those_of_config(tmp_path):
    run_dir = write_fixture_run(tmp_path)
    matrix = write_matrix(tmp_path, **{**MATRIX, "report": {"drift_ratio": 5000.0, "slowdown_ratio": 1.5}})
    [recorded] = upgrade_diffs(load_run(run_dir))
    assert recorded.drift and recorded.settings.drift_ratio == 10.0  # what the run recorded in plan.json
    [configured] = upgrade_diffs(load_run(run_dir, str(matrix)))
    assert configured.drift == [] and configured.settings.drift_ratio == 5000.0


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (1e-9, 1e-8, False),  # exactly 10x is not beyond 10x
        (1e-9, 1.1e-8, True),
        (0.0, 0.0, False),
        (0.0, 1e-12, True),  # left exact equality
        (1e-3, math.nan, True),
        (math.nan, math.nan, False),
        (math.nan, 1.0, False),
        (1e-6, 1e-9, False),
        (1.0, math.inf, True),
    ],
)
def test_when_drift_counts_as_grown(before, after, expected):
    assert grew(before, after, 10.0) is expected


def record(status, duration=1.0, **figures):
    return TestRecord("2.13.0", "ws1", "s", "t", status, duration, figures=figures)


def test_non_drift_figures_and_failed_tests_do_not_count_as_drift_or_slowdown():
    settings = ReportSettings(drift_ratio=10.0, slowdown_ratio=1.5)
    diff = diff_records(
        [record("passed", 1.0, sharded_states=1.0)], [record("failed", 60.0, sharded_states=100.0)], settings, "a", "b"
    )
    assert diff.drift == [] and diff.slowdowns == [] and len(diff.unconfirmed) == 1


def test_tests_on_one_side_only_are_counted_not_diffed():
    settings = ReportSettings()
    only_old = TestRecord("2.13.0", "ws1", "s", "gone", "passed", 1.0)
    diff = diff_records([record("passed"), only_old], [record("passed")], settings, "a", "b")
    assert (diff.compared, diff.only_before, diff.only_after, diff.clean) == (1, 1, 0, True)


def test_compare_matches_runs_by_torch_version(tmp_path):
    main = write_fixture_run(tmp_path, run_id="main")
    pr = write_fixture_run(tmp_path, run_id="pr")
    diffs = compare_runs(load_run(main), load_run(pr))
    assert [(d.before, d.after) for d in diffs] == [
        ("main (torch 2.13.0)", "pr (torch 2.13.0)"),
        ("main (torch 2.14.1)", "pr (torch 2.14.1)"),
    ]
    assert all(d.clean for d in diffs)


def test_compare_of_two_one_version_runs_diffs_their_versions(tmp_path):
    old = write_single_version_run(tmp_path, BASELINE, "old")
    new = write_single_version_run(tmp_path, CANDIDATE, "new")
    [diff] = compare_runs(load_run(old), load_run(new))
    assert summary(diff.regressions) == [("alpha", "test_regress", "ws2-fsdp2", 1)]


def test_compare_refuses_runs_without_a_common_version(tmp_path):
    old = write_fixture_run(tmp_path, versions=(BASELINE,), run_id="old")
    new = write_fixture_run(tmp_path, versions=(CANDIDATE, "2.15.0"), run_id="new")
    with pytest.raises(CompareError, match="no version in common"):
        compare_runs(load_run(old), load_run(new))


def test_compare_command_exits_1_on_a_regression_and_0_without(tmp_path):
    project = Project(tmp_path)
    old = write_single_version_run(tmp_path, BASELINE, "old")
    new = write_single_version_run(tmp_path, CANDIDATE, "new")
    regressed = project.torchmatrix("compare", str(old), str(new), "--out", str(new / "compare-old.md"))
    assert regressed.returncode == 1, regressed.stderr
    assert "#### Regressions" in regressed.stdout and "`test_regress`" in regressed.stdout
    written = (new / "compare-old.md").read_text()
    assert "#### Regressions" in written and written.strip() in regressed.stdout, "the file holds the printed diff"
    same = project.torchmatrix("compare", str(old), str(old))
    assert same.returncode == 0, same.stderr
    assert "0 regressions" in same.stdout
    missing = project.torchmatrix("compare", str(old), str(tmp_path / "nope"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_grown_drift_is_summarised_per_measure_by_the_figure_that_grew_most():
    before = record("passed", **{"grad_max_abs/a": 1e-9, "grad_max_abs/b": 1e-9, "loss_max_abs": 0.0})
    after = record("passed", **{"grad_max_abs/a": 1e-6, "grad_max_abs/b": 1e-5, "loss_max_abs": 1e-7})
    diff = diff_records([before], [after], ReportSettings(), "a", "b")
    assert len(diff.drift) == 3
    summary = [(d.figure, d.growth, grown) for d, grown in diff.drift_by_measure()]
    assert summary == [("loss_max_abs", "was exactly 0", 1), ("grad_max_abs/b", "10000.0×", 2)]
