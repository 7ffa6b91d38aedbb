"""What crosses a torch bump, on recorded figures: the slowdown rule in CPU time against wall time
under a recorded load, the checkpoint directions (rollback, forward) from cross_version records, and
the exit code of `compare` and `report --check-upgrade` on them. How the rule behaves on a loaded
machine is measured by bench/slowdown_under_load.py, not here."""

from __future__ import annotations

import json

import pytest

from torchmatrix.matrix.config import ReportSettings
from torchmatrix.reports import results_json
from torchmatrix.reports.checkpoint_directions import WRITE_TEST, checkpoint_directions
from torchmatrix.reports.records import RunResults, TestRecord, VersionInfo
from torchmatrix.reports.upgrade_diff import diff_records

from helpers.projects import Project

BASELINE, CANDIDATE = "2.13.0", "2.15.0"
READ = "test_loads_checkpoint_written_by[writer={}]"
CHECKPOINT_EXCEPTION = "CheckpointException: global metadata read failed: too many values to unpack (expected 5)"


def timed(wall: list[float], cpu: list[float] | None) -> list[TestRecord]:
    return [
        TestRecord("v", "ws1", "s", f"t{i}", "passed", w, figures={} if cpu is None else {"cpu_seconds": cpu[i]})
        for i, w in enumerate(wall)
    ]


@pytest.mark.parametrize(
    ("before", "after", "flagged", "measure"),
    [
        # The recorded case of issue 28: the candidate ran at load ~15 on 2 cores, the baseline at ~2.6.
        # Wall time 1.8x, CPU time unchanged: the machine, not torch.
        (([10.0] * 4, [8.0] * 4), ([18.0] * 4, [8.2] * 4), False, None),
        # A real 2x compute cost shows in CPU time whatever the wall time did.
        (([10.0] * 4, [8.0] * 4), ([11.0] * 4, [16.5] * 4), True, "cpu"),
        # One test hit by a CPU-hungry neighbour: the median did not move.
        (([10.0] * 4, [8.0] * 4), ([10.0] * 4, [30.0, 8.0, 8.0, 8.0]), False, None),
        # Runs from before CPU time was recorded: wall time, as before.
        (([2.0] * 4, None), ([6.0] * 4, None), True, "wall"),
    ],
)
def test_slowdowns_are_measured_in_cpu_time_where_both_sides_recorded_it(before, after, flagged, measure):
    diff = diff_records(timed(*before), timed(*after), ReportSettings(slowdown_ratio=1.5), "a", "b")
    assert bool(diff.slowdowns) is flagged
    if flagged:
        assert diff.slowdowns[0].measure == measure
        assert (diff.slowdowns[0].wall_before, diff.slowdowns[0].wall_after) == (sum(before[0]), sum(after[0]))


def test_one_side_without_cpu_time_falls_back_to_wall_time():
    diff = diff_records(timed([2.0] * 4, [2.0] * 4), timed([6.0] * 4, None), ReportSettings(), "a", "b")
    assert [s.measure for s in diff.slowdowns] == ["wall"]


def run_results(tests: list[TestRecord], load: dict[str, dict] | None = None) -> RunResults:
    load = load or {}
    return RunResults(
        run_id="run",
        created="",
        hosts=[],
        matrix_path="",
        matrix_sha256="",
        baseline=BASELINE,
        settings=ReportSettings(),
        versions=[VersionInfo(v, load_average=load.get(v, {})) for v in (BASELINE, CANDIDATE)],
        cells={"ws1": {}, "ws2": {}},
        tests=tests,
    )


def cross(torch: str, cell: str, test: str, status: str = "passed", message: str = "") -> TestRecord:
    return TestRecord(torch, cell, "cross_version", test, status, 1.0, message)


def both_wrote(*cells: str) -> list[TestRecord]:
    return [cross(v, c, WRITE_TEST) for v in (BASELINE, CANDIDATE) for c in cells]


def test_a_rollback_that_fails_names_its_root_cause_and_the_forward_direction_stays_exact():
    tests = both_wrote("ws1", "ws2") + [
        cross(BASELINE, cell, READ.format(CANDIDATE), "failed", CHECKPOINT_EXCEPTION) for cell in ("ws1", "ws2")
    ]
    tests += [cross(CANDIDATE, cell, READ.format(BASELINE)) for cell in ("ws1", "ws2")]
    rollback, forward = checkpoint_directions(run_results(tests), BASELINE, CANDIDATE)
    assert (rollback.name, rollback.writer, rollback.reader, rollback.broken) == ("rollback", CANDIDATE, BASELINE, True)
    assert rollback.failed == {CHECKPOINT_EXCEPTION: ("ws1", "ws2")}
    assert rollback.verdict == "checkpoints written by 2.15.0 cannot be read by 2.13.0"
    assert (forward.passed, forward.broken, forward.not_checked) == (("ws1", "ws2"), False, {})


def test_missing_writes_or_reads_are_not_checked_never_passed():
    only_baseline_wrote = [cross(BASELINE, "ws1", WRITE_TEST)]
    skipped = f"not checked: torch {CANDIDATE} wrote no checkpoint for this cell in reports/run"
    tests = only_baseline_wrote + [cross(BASELINE, "ws1", READ.format(CANDIDATE), "skipped", skipped)]
    rollback, forward = checkpoint_directions(run_results(tests), BASELINE, CANDIDATE)
    assert not rollback.passed and not rollback.broken
    assert [reason.split(" (")[0] for reason in rollback.not_checked] == [
        f"not checked: torch {CANDIDATE} wrote no checkpoint for this cell"
    ]
    assert not forward.passed and list(forward.not_checked) == [
        f"not checked: torch {CANDIDATE} never ran its read pass here (`python -m torchmatrix cross-read run` runs it)"
    ]
    assert forward.verdict == f"not checked: no checkpoint written by {BASELINE} was read by {CANDIDATE}"


def test_no_cross_version_suite_means_no_section():
    assert (
        checkpoint_directions(run_results([TestRecord(BASELINE, "ws1", "s", "t", "passed", 1.0)]), BASELINE, CANDIDATE)
        == []
    )


def write_results(path, tests, load=None):
    path.mkdir(parents=True)
    results_json.write_json(path / results_json.FILE_NAME, run_results(tests, load), [])
    return path / results_json.FILE_NAME


def test_compare_exits_1_on_a_broken_direction_and_on_a_slowdown_and_shows_the_load(tmp_path):
    project = Project(tmp_path)
    exact = both_wrote("ws1") + [
        cross(BASELINE, "ws1", READ.format(CANDIDATE)),
        cross(CANDIDATE, "ws1", READ.format(BASELINE)),
    ]
    broken = both_wrote("ws1") + [
        cross(BASELINE, "ws1", READ.format(CANDIDATE), "failed", CHECKPOINT_EXCEPTION),
        cross(CANDIDATE, "ws1", READ.format(BASELINE)),
    ]
    good = write_results(tmp_path / "good", exact)
    bad = write_results(tmp_path / "bad", broken)
    same = project.torchmatrix("compare", str(good), str(good))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "✅ **rollback**: checkpoints written by 2.15.0 load exactly under 2.13.0" in same.stdout
    done = project.torchmatrix("compare", str(good), str(bad))
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "❌ **rollback**: checkpoints written by 2.15.0 cannot be read by 2.13.0, caused by 2.15.0's writer"
        f" — `{CHECKPOINT_EXCEPTION}` (0 cells exact, 1 cell failed)" in done.stdout
    )
    load = {"mean": 15.0, "max": 16.1, "samples": 9, "cores": 2}
    slow_tests = [
        TestRecord(CANDIDATE, "ws1", "s", f"t{i}", "passed", 10.0, figures={"cpu_seconds": 16.0}) for i in range(4)
    ]
    fast_tests = [
        TestRecord(CANDIDATE, "ws1", "s", f"t{i}", "passed", 10.0, figures={"cpu_seconds": 8.0}) for i in range(4)
    ]
    fast = write_results(tmp_path / "fast", fast_tests, {CANDIDATE: {**load, "mean": 2.6}})
    slow = write_results(tmp_path / "slow", slow_tests, {CANDIDATE: load})
    slower = project.torchmatrix("compare", str(fast), str(slow))
    assert slower.returncode == 1, slower.stdout + slower.stderr
    assert "load average 2.6 (max 16.1, 2 cores) while run (torch 2.15.0) ran, 15 (max 16.1, 2 cores)" in slower.stdout
    assert "| `s` | cpu | 32.0 s | 64.0 s | 2.0× | 2.0× | 40.0 s → 40.0 s | 4 |" in slower.stdout


def test_results_json_of_the_previous_schema_still_reads(tmp_path):
    path = write_results(tmp_path / "r", both_wrote("ws1"))
    data = json.loads(path.read_text())
    assert data["schema_version"] == results_json.SCHEMA_VERSION
    data["schema_version"] = 3
    for version in data["versions"]:
        del version["load_average"]
    assert [v.torch for v in results_json.from_json(data).versions] == [BASELINE, CANDIDATE]


def test_a_malformed_warning_entry_is_refused_with_one_line(tmp_path):
    record = TestRecord(BASELINE, "ws1", "s", "t", "passed", 1.0, warnings=({"category": "UserWarning", "count": "9"},))
    path = write_results(tmp_path / "r", [record])
    with pytest.raises(results_json.ResultsError, match="warnings entry .* is not a table with an integer count"):
        results_json.read_json(path)


def test_reads_a_representative_cell_ran_group_as_one_root_cause_whatever_cell_the_path_names():
    """cross_version's result depends on fewer axes than a cell has: ws1-b's read ran in ws1-a, and the
    message names ws1-a's checkpoint; every cell's failure is still one root cause, paths relative."""
    message = "FileNotFoundError: '/home/me/reports/run/torch-2.15.0/checkpoints/{}/__0.metadata'"
    tests = [cross(v, c, WRITE_TEST) for v in (BASELINE, CANDIDATE) for c in ("ws1-a", "ws2")]
    tests += [
        TestRecord(BASELINE, "ws1-a", "cross_version", READ.format(CANDIDATE), "failed", 1.0, message.format("ws1-a")),
        TestRecord(
            BASELINE,
            "ws1-b",
            "cross_version",
            READ.format(CANDIDATE),
            "failed",
            1.0,
            message.format("ws1-a"),
            ran_in="ws1-a",
        ),
        TestRecord(BASELINE, "ws2", "cross_version", READ.format(CANDIDATE), "failed", 1.0, message.format("ws2")),
    ]
    rollback, _ = checkpoint_directions(run_results(tests), BASELINE, CANDIDATE)
    ((cause, cells),) = rollback.failed.items()
    assert (cause, sorted(cells)) == (
        "FileNotFoundError: 'torch-2.15.0/checkpoints/<cell>/__0.metadata'",
        ["ws1-a", "ws1-b", "ws2"],
    )
