"""Memory that grew between two torch versions, by what grew.

Two kinds of figure, two rules (docs/explanation/peak-memory.md has the noise they were set from):

- A training step's bytes by kind of tensor (`step_peak_bytes/<kind>`, the peak_memory suite) are
  exact run after run, but for some tens of KB of collective buffers under FSDP. A kind grew when it rose past
  `memory_ratio` times its bytes, by MIN_STEP_GROWTH_BYTES or more (a kind that held nothing and now
  holds that much grew too), in a test that passed on both sides.
- A process's resident high-water mark and a GPU allocator's peaks (every test's, ranks/memory_peaks.py)
  carry what the interpreter, the libraries and earlier tests left resident. As slowdowns are judged,
  a suite grew only when its total over tests that passed on both sides and the median of those tests'
  own ratios both rose past `memory_ratio`, by MIN_PROCESS_GROWTH_BYTES or more, over MIN_PEAK_TESTS tests.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from statistics import median

from torchmatrix.json_records import JsonRecord
from torchmatrix.messages.properties import MEMORY_PEAKS, STEP_PEAK
from torchmatrix.reports.records import TestRecord
from torchmatrix.status import Status

MIN_STEP_GROWTH_BYTES = 64 * 1024
MIN_PROCESS_GROWTH_BYTES = 64 * 1024 * 1024
MIN_PEAK_TESTS = 3
MEMORY_RULE = (
    "A training step's bytes by kind of tensor are exact (but for some KB of collective buffers), so a kind is flagged in its cell when it grew that much "
    f"and by {MIN_STEP_GROWTH_BYTES // 1024} KiB or more. A process's resident high-water mark and the GPU "
    "allocator's peaks carry what earlier tests left, so a suite is flagged only when the total and the median test "
    f"both grew that much, by {MIN_PROCESS_GROWTH_BYTES // 2**20} MiB or more, over {MIN_PEAK_TESTS} or more tests."
)


@dataclass(frozen=True)
class MemoryGrowth(JsonRecord):
    """A figure that grew past the ratio: one cell's step figure (`test` and `cell` set), or a suite's
    process peak summed over `tests` tests (`test` and `cell` empty)."""

    suite: str
    figure: str
    before: int
    after: int
    test: str = ""
    cell: str = ""
    tests: int = 1

    @property
    def what(self) -> str:
        """What grew, in words: the kind of tensor of a step figure, else the process peak's name."""
        if self.figure.startswith(f"{STEP_PEAK}/"):
            return self.figure.split("/", 1)[1].replace("_", " ")
        if self.figure == STEP_PEAK:
            return "the step's total"
        return self.figure.removesuffix("_bytes").replace("_", " ")

    @property
    def growth(self) -> str:
        """How much it grew: a ratio, or "from 0"."""
        return f"{self.after / self.before:.2f}×" if self.before else "from 0"


def memory_growth(old: dict, new: dict, ratio: float, peaks: tuple[str, ...] = MEMORY_PEAKS) -> list[MemoryGrowth]:
    """Step figures that grew per cell, then the process peaks `peaks` that grew per suite (module docstring)."""
    passed = [(old[key], new[key]) for key in new if key in old and old[key].status is new[key].status is Status.PASSED]
    grown = [growth for a, b in passed for growth in _step_growth(a, b, ratio)]
    grown.sort(key=lambda growth: growth.after - growth.before, reverse=True)
    return grown + _process_growth(passed, ratio, peaks)


def _step_growth(before: TestRecord, after: TestRecord, ratio: float) -> list[MemoryGrowth]:
    found = []
    for figure, value in after.figures.items():
        if figure != STEP_PEAK and not figure.startswith(f"{STEP_PEAK}/"):
            continue
        old, new = _bytes(before.figures.get(figure)), _bytes(value)
        if old is not None and new is not None and new > ratio * old and new - old >= MIN_STEP_GROWTH_BYTES:
            found.append(MemoryGrowth(after.suite, figure, old, new, after.test, after.ran_in or after.cell))
    return found


def _process_growth(
    passed: list[tuple[TestRecord, TestRecord]], ratio: float, peaks: tuple[str, ...]
) -> list[MemoryGrowth]:
    pairs: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for a, b in passed:
        for figure in peaks:
            old, new = _bytes(a.figures.get(figure)), _bytes(b.figures.get(figure))
            if old and new:
                pairs[(b.suite, figure)].append((old, new))
    found = []
    for (suite, figure), values in sorted(pairs.items()):
        if len(values) < MIN_PEAK_TESTS:
            continue
        before, after = sum(old for old, _ in values), sum(new for _, new in values)
        typical = median(new / old for old, new in values)
        if after > ratio * before and typical > ratio and after - before >= MIN_PROCESS_GROWTH_BYTES:
            found.append(MemoryGrowth(suite, figure, before, after, tests=len(values)))
    return found


def _bytes(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0 else None
