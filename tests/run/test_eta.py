"""The ETA: seeded from earlier runs' suite durations in reports/ (else per-suite priors), blended
with the observed rate, counted across every torch version of one invocation and the phases after
the cells (installs, read passes, report), never negative, and unknown when nothing can say."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest

from torchmatrix.cli import build_parser
from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.config import Suite
from torchmatrix.matrix.plan import plan_runs
from torchmatrix.run import progress
from torchmatrix.run.eta import (
    COLD,
    PRIOR_SUITE_SECONDS,
    READ_CELL_S,
    READ_START_S,
    REPORT_S,
    STARTUP_S,
    WARM,
    LaterPhases,
    WorkEstimate,
    contention,
    rerun_seconds,
    suite_history,
)
from torchmatrix.run.progress import InvocationPart, Progress
from torchmatrix.status import Status

TOTALS = {status: 0 for status in Status}


def earlier_run(reports: Path, run_id: str, tests: list[dict], age: float = 0.0) -> Path:
    """reports/<run_id>/results.json holding `tests` (only the keys the estimate reads matter)."""
    path = reports / run_id / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema": "torchmatrix.results", "tests": tests}))
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return path


def record(torch: str, cell: str, suite: str, duration: float, ran_in: str | None = None) -> dict:
    return {"torch": torch, "cell": cell, "suite": suite, "test": "t", "duration": duration, "ran_in": ran_in}


def four_cells_two_suites(big_timeout: float = 600.0):
    """Four one-rank cells, each running suite `big` and suite `small` itself."""
    cells = [Cell({"world_size": 1, "fsdp": fsdp}) for fsdp in "abcd"]
    suites = {
        "big": Suite("big", "suites/test_big.py", big_timeout, ("fsdp",)),
        "small": Suite("small", "suites/test_small.py", 60.0, ("fsdp",)),
    }
    return cells, plan_runs(cells, suites)


def test_suite_history_sums_a_suite_runs_tests_and_prefers_the_same_torch(tmp_path):
    reports = tmp_path / "reports"
    earlier_run(
        reports,
        "old-a",
        [
            record("2.13.0", "ws1-a", "big", 4.0),
            record("2.13.0", "ws1-a", "big", 6.0),
            record("2.13.0", "ws1-b", "big", 6.0, ran_in="ws1-a"),  # shared, not run again
            record("2.13.0", "ws1-b", "small", 2.0),
        ],
    )
    earlier_run(reports, "old-b", [record("2.14.1", "ws1-a", "big", 100.0)])
    (reports / "latest").symlink_to("old-a")
    (reports / "broken").mkdir()
    (reports / "broken" / "results.json").write_text("{not json")
    earlier_run(reports, "now", [record("2.13.0", "ws1-a", "big", 1000.0)])

    assert suite_history(reports, "2.13.0", current_run="now").per_suite == {"big": 10.0, "small": 2.0}
    assert suite_history(reports, "2.15.0", current_run="now").per_suite == {"big": 55.0, "small": 2.0}
    assert suite_history(tmp_path / "no-reports", "2.13.0", current_run="now").per_suite == {}
    compiled_nothing = {  # so each costs as much with the compile store cold as warm
        ("ws1-a", "big"): 10.0,
        ("ws1-b", "big"): 0.0,  # read from ws1-a: it cost this cell nothing
        ("ws1-b", "small"): 2.0,
    }
    assert suite_history(reports, "2.13.0", current_run="now").per_run == {
        (cell, suite, state): seconds for (cell, suite), seconds in compiled_nothing.items() for state in (COLD, WARM)
    }


def test_a_suite_run_the_history_holds_costs_what_it_took_there_not_its_suites_mean():
    """A compiled cell's run costs many times an eager one's, and a run whose results a cell read
    from another costs it nothing: the run's own history says so, the suite's mean only where it is silent."""
    cells, runs = four_cells_two_suites()
    own = {(cells[0].id, "big", COLD): 30.0, (cells[1].id, "big", COLD): 0.0, (cells[1].id, "big", WARM): 0.0}
    estimate = WorkEstimate.of_runs(runs, {"big": 10.0, "small": 2.0}, slots=2, per_run=own)
    assert estimate.per_cell == {cells[0].id: 32.0, cells[1].id: 2.0, cells[2].id: 12.0, cells[3].id: 12.0}


def test_a_run_costs_what_it_took_with_the_compile_store_as_it_stands_for_its_cell_now(tmp_path):
    """A cell whose graphs the store holds costs what its warm runs took, one whose graphs it lacks its
    cold runs; where the history holds only the other kind, that kind."""
    reports = tmp_path / "reports"
    compiled = [
        ("cold-run", 20.0, {"compile_seconds": 15.0}),
        ("warm-run", 6.0, {"compile_seconds": 2.0, "compile_seconds_saved": 13.0}),
    ]
    for age, (run_id, cpu, figures) in enumerate(compiled):
        tests = [
            {**record("2.13.0", "ws1-a", "big", 30.0), "figures": {"cpu_seconds": cpu, **figures}},
            {**record("2.13.0", "ws1-b", "big", 30.0), "figures": {"cpu_seconds": 9.0, "compile_seconds": 5.0}},
        ]
        earlier_run(reports, run_id, tests, age=100.0 * age)
    history = suite_history(reports, "2.13.0", current_run="now", cpu_slots=2)
    assert history.per_run == {
        ("ws1-a", "big", COLD): 20.0,
        ("ws1-a", "big", WARM): 6.0,
        ("ws1-b", "big", COLD): 9.0,  # compiled and saved nothing both times: a backend the store does not keep
    }
    cells, runs = four_cells_two_suites()
    known = {"big": 10.0, "small": 2.0}
    warm = WorkEstimate.of_runs(runs, known, slots=2, per_run=history.per_run, warm_cells={"ws1-a", "ws1-b"})
    cold = WorkEstimate.of_runs(runs, known, slots=2, per_run=history.per_run)
    assert (warm.per_cell["ws1-a"], cold.per_cell["ws1-a"]) == (6.0 + 2.0, 20.0 + 2.0)
    assert warm.per_cell["ws1-b"] == cold.per_cell["ws1-b"] == 9.0 + 2.0


def test_on_simulated_ranks_a_test_costs_its_ranks_cpu_seconds_over_the_cores_its_cell_may_use(tmp_path):
    """Side by side on two cores, a test's duration also counts the time it waited for the cores the
    other pytest process held: its ranks' CPU seconds say what it needs of the slots."""
    reports = tmp_path / "reports"
    path = reports / "old" / "results.json"
    path.parent.mkdir(parents=True)
    cells = [{"id": f"ws{n}", "axes": {"world_size": str(n)}} for n in (1, 2, 4)]
    tests = [
        {**record("2.13.0", "ws1", "big", 10.0), "figures": {"cpu_seconds": 4.0}},
        {**record("2.13.0", "ws2", "big", 10.0), "figures": {"cpu_seconds": 8.0}},
        {**record("2.13.0", "ws4", "big", 10.0), "figures": {"cpu_seconds": 12.0}},  # four ranks on two cores
        {**record("2.13.0", "ws4", "small", 3.0), "figures": {}},  # no CPU figure: its duration
        # a cell `cells` does not describe: one core
        {**record("2.13.0", "unknown", "small", 1.0), "figures": {"cpu_seconds": 5.0}},
    ]
    path.write_text(json.dumps({"schema": "torchmatrix.results", "cells": cells, "tests": tests}))

    assert suite_history(reports, "2.13.0", current_run="now", cpu_slots=2).per_suite == {
        "big": pytest.approx((4.0 + 8.0 / 2 + 12.0 / 2) / 3),
        "small": 4.0,
    }
    assert suite_history(reports, "2.13.0", current_run="now").per_suite == {"big": 10.0, "small": 2.0}, (
        "GPUs: durations"
    )


def test_only_the_latest_runs_count(tmp_path):
    reports = tmp_path / "reports"
    for age in range(8):
        earlier_run(reports, f"run-{age}", [record("2.13.0", "ws1-a", "big", 10.0 + age)], age=100.0 * age)
    assert suite_history(reports, "2.13.0", current_run="now").per_suite == {"big": 12.0}  # 10..14: the newest five


def test_the_first_cells_eta_comes_from_earlier_durations_not_the_elapsed_time(tmp_path):
    """Four cells of 12 slot-seconds each on two slots take about 24 s. The first cell finishes
    at 15 s (all four started together); elapsed/done × remaining would say 45 s."""
    reports = tmp_path / "reports"
    earlier_run(
        reports,
        "old",
        [record("2.13.0", f"ws1-{x}", suite, d) for x in "ab" for suite, d in [("big", 10.0), ("small", 2.0)]],
    )
    cells, runs = four_cells_two_suites()
    estimate = WorkEstimate.of_runs(runs, suite_history(reports, "2.13.0", current_run="now").per_suite, slots=2)
    assert estimate.per_cell == {cell.id: 12.0 for cell in cells} and estimate.total == 48.0

    seeded = estimate.remaining_seconds(elapsed=15.0, done=12.0, left=36.0)
    assert seeded == pytest.approx(0.75 * 0.5 * 36 + 0.25 * (15 / 12) * 36)  # 24.75 s: mostly the seed
    assert estimate.remaining_seconds(elapsed=15.0, done=0.0, left=48.0) == pytest.approx(24.0)
    assert estimate.remaining_seconds(elapsed=50.0, done=48.0, left=0.0) == 0.0
    late = estimate.remaining_seconds(elapsed=40.0, done=36.0, left=12.0)
    assert late == pytest.approx(0.25 * 0.5 * 12 + 0.75 * (40 / 36) * 12)  # mostly what was observed

    _, slow_suite = four_cells_two_suites(big_timeout=3600.0)
    assert WorkEstimate.of_runs(slow_suite, {"big": 10.0, "small": 2.0}, slots=2) == estimate, (
        "timeouts are not estimates"
    )


def test_a_suite_without_history_costs_its_prior_and_no_history_seeds_from_the_priors():
    cells, runs = four_cells_two_suites()
    assert WorkEstimate.of_runs(runs, {"big": 10.0}, slots=4).per_cell == {cell.id: 20.0 for cell in cells}
    wide = plan_runs([Cell({"world_size": 4})], {"big": Suite("big", "suites/test_big.py", 60.0, ())})
    assert WorkEstimate.of_runs(wide, {"big": 10.0}, slots=2).per_cell == {"ws4": 20.0}, (
        "a run holds at most every slot"
    )
    builtin = {
        "grad_ckpt": Suite("grad_ckpt", "suites/test_grad_ckpt.py", 600.0, ("fsdp",)),
        "mine": Suite("mine", "suites/test_mine.py", 600.0, ("fsdp",)),
    }
    primed = WorkEstimate.of_runs(plan_runs(cells, builtin), {}, slots=2)
    prior_mean = sum(PRIOR_SUITE_SECONDS.values()) / len(PRIOR_SUITE_SECONDS)
    assert primed.per_cell == {cell.id: PRIOR_SUITE_SECONDS["grad_ckpt"] + prior_mean for cell in cells}
    assert not primed.from_history and WorkEstimate.of_runs(runs, {"big": 10.0}, slots=4).from_history
    seen = WorkEstimate.of_runs(plan_runs(cells, builtin), {"mine": 3.0}, slots=2)
    assert seen.per_cell == {cell.id: PRIOR_SUITE_SECONDS["grad_ckpt"] + 3.0 for cell in cells}, (
        "history where it exists, the prior where it does not"
    )


def test_a_busy_machine_slows_the_idle_priors_but_not_its_own_history():
    """The priors are idle figures: on a machine whose load average is 6 on 2 cores, work runs about
    3 times slower, so the seed says so; earlier runs' durations were measured here and are taken as they are."""
    assert contention(0.7, 2) == 1.0 and contention(6.0, 2) == 3.0, "never faster than idle"
    cells, runs = four_cells_two_suites()
    idle = WorkEstimate.of_runs(runs, {}, slots=2)
    busy = WorkEstimate.of_runs(runs, {}, slots=2, contention=3.0)
    assert busy.remaining_seconds(0.0, 0.0, 48.0) == pytest.approx(3 * idle.remaining_seconds(0.0, 0.0, 48.0))
    assert WorkEstimate.of_runs(runs, {"big": 10.0}, slots=2, contention=3.0).contention == 1.0
    after = LaterPhases(read_passes=1, read_cells=4, report=True)
    assert after.seconds(startup=0.0, slots=2, contention=3.0) == pytest.approx(3 * after.seconds(startup=0.0, slots=2))


def test_the_phases_after_the_cells_count_installs_starts_reads_and_the_report():
    after = LaterPhases(versions=1, installs=120.0, read_passes=2, read_cells=4, report=True)
    assert after.seconds(startup=30.0, slots=2) == pytest.approx(
        120 + 30 + 2 * (READ_START_S + 4 * READ_CELL_S / 2) + REPORT_S
    )
    on_cpu = LaterPhases(read_passes=1, read_cells=4, reads_side_by_side=False)
    assert on_cpu.seconds(startup=30.0, slots=2) == pytest.approx(READ_START_S + 4 * READ_CELL_S), (
        "a CPU read pass reads in one process"
    )
    assert LaterPhases().seconds(startup=30.0, slots=2) == 0.0, "the last version, no report: nothing after"
    assert LaterPhases(versions=1, installs=None).seconds(startup=30.0, slots=2) == 30.0, (
        "unknown installs are not guessed"
    )


def eta_of_line(line: str) -> str:
    return line.rsplit("ETA ", 1)[1].strip()


class Clock:
    """Stands in for the time module in torchmatrix.run.progress."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(progress, "time", clock)
    return clock


def test_the_progress_line_shows_the_seeded_eta(clock):
    """Four cells of 12 slot-seconds on two slots. The first finishes 15 s in (process starts and
    imports included): the seed alone says 18 s are left. The second, 5 s later, brings in the
    rate observed since the first."""
    _, runs = four_cells_two_suites()
    estimate = WorkEstimate.of_runs(runs, {"big": 10.0, "small": 2.0}, slots=2)
    seeded, plain = io.StringIO(), io.StringIO()
    lines = [Progress("2.13.0", 4, seeded), Progress("2.13.0", 4, plain)]
    lines[0].seed(estimate, LaterPhases())
    for cell, seconds in [("ws1-a", 15.0), ("ws1-b", 5.0)]:
        clock.now += seconds
        for line in lines:
            line.cell_finished(cell, [("big::t", Status.PASSED)], TOTALS)
    assert [eta_of_line(line) for line in seeded.getvalue().splitlines()] == [
        "0:18",
        "0:11",
    ]  # 24 x (2/3 x 0.5 + 1/3 x 5/12)
    assert [eta_of_line(line) for line in plain.getvalue().splitlines()] == ["0:45", "0:20"]


def test_the_count_and_elapsed_time_continue_across_the_versions_of_an_invocation(clock):
    """The second of three versions, each of two cells, started a minute into the invocation:
    the ETA rates this runner's cells, not the minute of installs and earlier versions, and adds
    for the version still to come its estimated install (50 s) and this one's wait for its first cell (10 s)."""
    stream = io.StringIO()
    part = Progress("2.14.1", 2, stream, part=InvocationPart(2, 3, since=clock.now - 60.0, installs_after=50.0))
    part.seed(WorkEstimate({"ws1-a": 10.0, "ws1-b": 10.0}, slots=1), LaterPhases(versions=1, installs=50.0))
    clock.now += 10.0
    part.cell_finished("ws1-a", [("g::t", Status.PASSED)], TOTALS)
    clock.now += 10.0
    part.cell_finished("ws1-b", [("g::t", Status.PASSED)], TOTALS)
    first, second = stream.getvalue().splitlines()
    assert first.startswith("[3/6] torch 2.14.1 ws1-a") and first.endswith("1:10 elapsed, ETA 1:30")
    assert second.startswith("[4/6] torch 2.14.1 ws1-b") and second.endswith("1:20 elapsed, ETA 1:20")

    _, runs = four_cells_two_suites()
    estimate = WorkEstimate.of_runs(runs, {"big": 10.0, "small": 2.0}, slots=2)
    last = Progress("2.14.1", 4, io.StringIO(), part=InvocationPart(2, 2, since=clock.now))
    last.seed(estimate, LaterPhases())
    assert (last.done, last.total, last.work_left) == (4, 8, 48.0)


def test_the_first_eta_comes_before_any_cell_and_counts_everything_after(clock):
    """The first of two versions, four cells of 12 slot-seconds on two slots, a report to follow
    with a read pass per version: at the start the ETA is the start-up prior, this version's
    and the next one's work, the next install, its start, both read passes and the report."""
    _, runs = four_cells_two_suites()
    estimate = WorkEstimate.of_runs(runs, {"big": 10.0, "small": 2.0}, slots=2)
    later = LaterPhases(versions=1, installs=100.0, read_passes=2, read_cells=4, report=True)
    line = Progress("2.13.0", 4, io.StringIO(), part=InvocationPart(1, 2, installs_after=100.0, report_follows=True))
    line.seed(estimate, later)
    expected = STARTUP_S + 2 * 48.0 / 2 + later.seconds(STARTUP_S, 2)
    assert line.eta_text() == f"ETA {progress.format_seconds(expected)}"
    clock.now += 10.0
    assert line.eta_text() == f"ETA {progress.format_seconds(expected - 10.0)}", "the start-up is counted down"
    clock.now += STARTUP_S
    assert line.eta_text() == f"ETA {progress.format_seconds(expected - STARTUP_S)}", "never below the work left"


def test_an_eta_nothing_can_say_is_unknown_and_installs_not_estimated_are_named(clock):
    unseeded = Progress("2.13.0", 4, io.StringIO())
    assert unseeded.eta_text() == "ETA unknown", "no estimate and no finished cell: nothing to rate"
    _, runs = four_cells_two_suites()
    line = Progress("2.13.0", 4, io.StringIO(), part=InvocationPart(1, 2, installs_after=None))
    line.seed(WorkEstimate.of_runs(runs, {"big": 10.0}, slots=2), LaterPhases(versions=1, installs=None))
    assert line.eta_text().endswith(" + installs not estimated")


def test_run_takes_its_part_of_the_invocation_on_the_command_line(capsys):
    args = build_parser().parse_args(["run", "--torch", "system", "--progress-part", "2/3", "--progress-since", "100"])
    assert (args.progress_part, args.progress_since, args.progress_installs_after) == ((2, 3), 100.0, 0.0)
    unknown = ["run", "--torch", "system", "--progress-installs-after", "unknown"]
    assert build_parser().parse_args(unknown).progress_installs_after is None
    with pytest.raises(SystemExit) as negative:
        build_parser().parse_args(["run", "--torch", "system", "--progress-installs-after", "-5"])
    assert negative.value.code == 2 and "pass seconds (0 or more) or 'unknown'" in capsys.readouterr().err
    assert build_parser().parse_args(["run", "--torch", "system"]).progress_part == (1, 1)
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["run", "--torch", "system", "--progress-part", "3/2"])
    assert refused.value.code == 2 and "write it as K/N with 1 <= K <= N" in capsys.readouterr().err


def test_a_line_comes_at_least_every_30_seconds_while_cells_run(clock):
    """No cell finishes for a minute: a heartbeat line at 30 s, none before, the last ETA counted
    down since it was given; a cell line resets the 30 s."""
    stream = io.StringIO()
    line = Progress("2.13.0", 4, stream)
    clock.now += 29
    line.heartbeat("4 cells to finish")
    assert stream.getvalue() == "", "nothing to say before 30 s of silence"
    clock.now += 1
    line.heartbeat("4 cells to finish")
    assert stream.getvalue().splitlines() == [
        "torchmatrix: torch 2.13.0: 0/4 cells done, 4 cells to finish | 0:30 elapsed"
    ]
    clock.now += 10
    line.cell_finished("ws1-a", [("big::t", Status.PASSED)], TOTALS)  # ETA 2:00: 40 s a cell, three left
    clock.now += 29
    line.heartbeat("3 cells to finish")
    assert len(stream.getvalue().splitlines()) == 2
    clock.now += 16
    line.heartbeat("3 cells to finish")
    assert stream.getvalue().splitlines()[-1] == (
        "torchmatrix: torch 2.13.0: 1/4 cells done, 3 cells to finish | 1:25 elapsed, ETA 1:15"
    )
    clock.now += 150
    line.heartbeat("3 cells to finish")
    assert stream.getvalue().splitlines()[-1] == (
        "torchmatrix: torch 2.13.0: 1/4 cells done, 3 cells to finish | 3:55 elapsed, ETA unknown (1:15 past the estimate)"
    ), "never a negative ETA, never 0:00 while work is left"


def test_the_performance_page_quotes_the_priors_the_code_uses():
    """docs/explanation/performance.md#the-eta states each prior; a prior changed in the code alone fails here."""
    from torchmatrix.env import install_estimate

    page = (Path(__file__).resolve().parents[2] / "docs" / "explanation" / "performance.md").read_text()
    section = page[page.index("## The ETA") :]
    for suite, seconds in PRIOR_SUITE_SECONDS.items():
        assert f"| `{suite}` | {seconds} |" in section, suite
    quoted = [
        f"{STARTUP_S:.0f} s until",
        f"{install_estimate.DOWNLOAD_BYTES_PER_S / 1e6:.0f} MB/s from a server",
        f"{install_estimate.COPY_BYTES_PER_S / 1e6:.0f} MB/s from a `file://` index",
        f"{install_estimate.UNPACK_BYTES_PER_S / 1e6:.0f} MB/s, and a",
        f"{install_estimate.CPU_S:.0f} s on an idle",
        f"{READ_START_S:.0f} s to start and {READ_CELL_S} slot-seconds a cell",
        f"then {REPORT_S:.0f} s for the report",
    ]
    for text in quoted:
        assert text in " ".join(section.split()), text


def test_the_re_runs_alone_are_counted_while_they_run(clock):
    """Each failed test re-runs in a fresh process, as many at once as there are slots: their starts
    and their first durations are in the ETA from the line that announces them until they end."""
    assert rerun_seconds(3, test_seconds=12.0, startup=10.0, slots=2) == pytest.approx(2 * 10.0 + 12.0 / 2)
    assert rerun_seconds(1, test_seconds=5.0, startup=10.0, slots=2) == pytest.approx(15.0), "one process, one slot"
    assert rerun_seconds(0, test_seconds=0.0, startup=10.0, slots=2) == 0.0
    line = Progress("2.13.0", 1, io.StringIO())
    line.seed(WorkEstimate({"ws1-a": 4.0}, slots=2), LaterPhases())
    clock.now += 20.0
    line.cell_finished("ws1-a", [("g::t", Status.FAILED)], TOTALS)
    assert line.eta_text() == "ETA 0:00"
    line.reruns_begin(32.0)
    assert line.eta_text() == "ETA 0:32"
    clock.now += 12.0
    assert line.eta_text() == "ETA 0:20"
    line.reruns_end()
    assert line.eta_text() == "ETA 0:00"
