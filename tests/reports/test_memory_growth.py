"""The upgrade diff's memory rule (torchmatrix/reports/memory_growth.py): exact step figures flagged per cell
past the ratio and the floor, process peaks only when a suite's total and median test both grew."""

from __future__ import annotations

from torchmatrix.reports.memory_growth import MIN_PROCESS_GROWTH_BYTES, MIN_STEP_GROWTH_BYTES, memory_growth
from torchmatrix.reports.records import TestRecord

MIB = 2**20


def record(test: str, status: str = "passed", suite: str = "peak_memory", **figures) -> TestRecord:
    return TestRecord("2.13.0", "ws1", suite, test, status, 1.0, figures=figures)


def diff(before: list[TestRecord], after: list[TestRecord], ratio: float = 1.25):
    return memory_growth({(r.suite, r.test): r for r in before}, {(r.suite, r.test): r for r in after}, ratio)


def step(test: str = "t", status: str = "passed", **kinds) -> TestRecord:
    return record(test, status, **{f"step_peak_bytes/{kind}": size for kind, size in kinds.items()})


def test_a_kind_grown_past_the_ratio_and_the_floor_is_named_with_its_cell():
    [growth] = diff([step(activations=64_648, parameters=214_656)], [step(activations=228_232, parameters=214_656)])
    assert (growth.what, growth.cell, growth.before, growth.after, growth.growth) == (
        "activations",
        "ws1",
        64_648,
        228_232,
        "3.53×",
    )


def test_growth_under_the_floor_or_the_ratio_is_not_flagged():
    small = 10_000
    assert diff([step(activations=small)], [step(activations=small + MIN_STEP_GROWTH_BYTES - 1)]) == []
    big = 100 * MIB
    assert diff([step(activations=big)], [step(activations=int(big * 1.2))]) == []


def test_a_kind_that_held_nothing_and_now_holds_much_grew_from_zero():
    [growth] = diff([step(optimizer_state=0)], [step(optimizer_state=MIN_STEP_GROWTH_BYTES)])
    assert (growth.what, growth.growth) == ("optimizer state", "from 0")


def test_a_test_that_failed_on_either_side_is_not_compared():
    assert diff([step(status="failed", activations=1)], [step(activations=10 * MIB)]) == []
    assert diff([step(activations=1)], [step(status="failed", activations=10 * MIB)]) == []


def resident(test: str, size: float, suite: str = "resume") -> TestRecord:
    return record(test, suite=suite, peak_rss_bytes=size)


def test_process_peaks_grow_only_when_the_suites_total_and_median_test_both_did():
    before = [resident(f"t{i}", 400 * MIB) for i in range(4)]
    one_test_spiked = [resident("t0", 1600 * MIB)] + before[1:]
    assert diff(before, one_test_spiked) == []  # the total grew 1.75x, the median test not at all
    every_test_grew = [resident(f"t{i}", 600 * MIB) for i in range(4)]
    [growth] = diff(before, every_test_grew)
    assert (growth.suite, growth.what, growth.tests, growth.cell) == ("resume", "peak rss", 4, "")


def test_process_peaks_need_enough_tests_and_bytes():
    two_tests = [resident(f"t{i}", 400 * MIB) for i in range(2)]
    assert diff(two_tests, [resident(f"t{i}", 800 * MIB) for i in range(2)]) == []
    small = [resident(f"t{i}", 10 * MIB) for i in range(4)]
    grown = [resident(f"t{i}", 10 * MIB + MIN_PROCESS_GROWTH_BYTES // 8) for i in range(4)]  # 1.8x, 32 MiB in all
    assert diff(small, grown) == []
