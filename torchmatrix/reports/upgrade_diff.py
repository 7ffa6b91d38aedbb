"""The torch-upgrade diff: what changed between a baseline and a candidate, test by test.

Tests are matched by (suite, test, the cell that actually ran them), so a result shared by many
cells through a representative is counted once. The same diff serves every version against the
baseline inside one run and one version across two runs (`torchmatrix compare`).

Only confirmed failures (re-run alone, failed again) make regressions and fixes; a status change
whose failing side passed alone, or was never re-run, is listed apart as unconfirmed. A test that
now hits a CPU-simulation limit checked nothing, as a skipped one did not: it is newly skipped, never a regression. A suite is
slower only when the slowdown is beyond what re-running the same torch shows (bench/timing_noise.py):
its total over tests that passed on both sides, and the median of those tests' own ratios, both
grew more than slowdown_ratio, by at least MIN_SLOWDOWN_SECONDS, over MIN_TIMED_TESTS tests that
took MIN_TIMED_SECONDS or more on the baseline. The measure is each test's CPU time (user + system
of its ranks and its pytest process) where both sides recorded it for every such test, since other
work on the machine stretches wall time but not the CPU a test uses (bench/slowdown_under_load.py);
wall time otherwise (runs from before CPU time was recorded).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from statistics import median

from torchmatrix.json_records import JsonRecord, json_field
from torchmatrix.matrix.channels import UNBLOCK_HINT, channel_of
from torchmatrix.matrix.config import ReportSettings
from torchmatrix.messages.properties import CPU_SECONDS, MEMORY_PEAKS
from torchmatrix.reports.build_kinds import UNCOMPARED_PEAKS, BuildMismatch, build_mismatch
from torchmatrix.reports.checkpoint_directions import Direction, checkpoint_directions
from torchmatrix.reports.memory_growth import MemoryGrowth, memory_growth
from torchmatrix.reports.records import RunResults, TestRecord, drift_measure, is_drift_figure
from torchmatrix.reports.warning_changes import CountChange, WarningGroup, count_changes, new_and_gone
from torchmatrix.status import Confirmation, Status
from torchmatrix.user_error import UserError

MIN_SLOWDOWN_SECONDS = 5.0
MIN_TIMED_SECONDS = 0.5
MIN_TIMED_TESTS = 3
SLOWDOWN_RULE = (
    "Measured in CPU time (user + system of the ranks and pytest; wall time for runs that did not record it), "
    "which other work on the machine does not stretch. "
    f"Flagged only when the total and the median test both grew that much, by {MIN_SLOWDOWN_SECONDS:g} s or more, "
    f"over {MIN_TIMED_TESTS} or more tests of {MIN_TIMED_SECONDS:g} s or more, so one test slowed by a busy core "
    "does not flag its suite."
)


class CompareError(UserError):
    """Two runs with nothing to compare; the message says which versions each has."""


def _json_float(value: float) -> float | str:
    """JSON has no NaN or infinity: those are written as the strings "nan", "inf", "-inf"."""
    return value if math.isfinite(value) else str(value)


def _round3(value: float) -> float:
    return round(value, 3)


@dataclass(frozen=True)
class FailCause:
    """One thing `compare` and `report --check-upgrade` exit 1 on (docs/reference/exit-codes.md lists each)."""

    name: str
    meaning: str


REGRESSION = FailCause("regression", "a confirmed regression: a test that passed on run A fails alone on run B")
GROWN_DRIFT = FailCause("drift", "a drift figure grown more than `[report] drift_ratio`, left exactly 0, or became NaN")
SLOWDOWN = FailCause("slowdown", "a suite slower than `[report] slowdown_ratio` beyond noise")
MEMORY = FailCause(
    "memory",
    "a training step's memory of one kind, or a suite's process peaks, grown past `[report] memory_ratio` beyond noise",
)
UNCONFIRMED = FailCause(
    "unconfirmed",
    "a status change whose failing side was never re-run alone (`--confirm-limit 0`, or past the limit): it cannot tell",
)
BROKEN_DIRECTION = FailCause(
    "checkpoint direction",
    "a broken checkpoint direction of run B: its baseline cannot read a candidate's checkpoint (rollback) "
    "or a candidate cannot read the baseline's (forward)",
)
FAIL_CAUSES = (REGRESSION, GROWN_DRIFT, SLOWDOWN, MEMORY, UNCONFIRMED, BROKEN_DIRECTION)


@dataclass(frozen=True)
class Change:
    """A test whose status differs between baseline and candidate."""

    before: TestRecord
    after: TestRecord
    cells: tuple[str, ...]

    @property
    def failing(self) -> TestRecord:
        """The side that failed (the candidate for a regression, the baseline for a fix)."""
        return self.after if self.after.status.is_failing else self.before

    @property
    def confirmed(self) -> bool:
        """Whether the failing side failed again when re-run alone."""
        return self.failing.confirmation == Confirmation.FAILS_ALONE

    def to_json(self) -> dict:
        """A view of both records, not a field dump: the test, where it ran, each side's status."""
        return {
            "suite": self.after.suite,
            "test": self.after.test,
            "cell": self.after.run_cell,
            "cells": list(self.cells),
            "before": self.before.status.value,
            "after": self.after.status.value,
            "message": self.after.message or self.before.message,
            "confirmation": Confirmation.written(self.failing.confirmation),
        }


@dataclass(frozen=True)
class DriftGrowth(JsonRecord):
    """A drift figure of one test that grew by more than the matrix's drift_ratio."""

    suite: str
    test: str
    cell: str
    figure: str
    before: float = field(metadata=json_field(dump=_json_float))
    after: float = field(
        metadata=json_field(dump=_json_float, then={"ratio": lambda growth: _json_float(growth.ratio)})
    )

    @property
    def ratio(self) -> float:
        if self.before == 0 or math.isnan(self.after):
            return math.inf
        return self.after / self.before

    @property
    def growth(self) -> str:
        """How much it grew, in words where a ratio means nothing (from exactly 0, to NaN)."""
        if math.isnan(self.after):
            return "became NaN"
        if self.before == 0:
            return "was exactly 0"
        return f"{self.ratio:.1f}×"


@dataclass(frozen=True)
class Slowdown(JsonRecord):
    """A suite that got slower beyond noise (the rule is in the module docstring), in `measure`
    ("cpu" or "wall") seconds, with the wall seconds beside them."""

    suite: str
    before: float
    after: float
    tests: int
    median_ratio: float = field(metadata=json_field(dump=_round3))
    measure: str = "wall"
    wall_before: float = 0.0
    wall_after: float = 0.0


@dataclass
class UpgradeDiff(JsonRecord):
    """Baseline vs candidate: regressions, fixes, newly skipped tests (CPU-simulation limits among them), grown
    drift, slowdowns, grown memory, warnings new, gone and changed, builds of different kinds, and within one run
    whether checkpoints cross the bump in each direction."""

    before: str
    after: str
    settings: ReportSettings = field(metadata=json_field(inline=True))
    compared: int = 0
    only_before: int = 0
    only_after: int = field(
        default=0, metadata=json_field(then={"regression_count": lambda diff: diff.regression_count})
    )
    regressions: list[Change] = field(default_factory=list)
    fixes: list[Change] = field(default_factory=list)
    unconfirmed: list[Change] = field(default_factory=list)
    newly_skipped: list[Change] = field(default_factory=list)
    drift: list[DriftGrowth] = field(default_factory=list)
    slowdowns: list[Slowdown] = field(default_factory=list)
    memory: list[MemoryGrowth] = field(default_factory=list)
    checkpoints: list[Direction] = field(default_factory=list)
    load: tuple[dict, dict] = field(
        default=({}, {}),
        metadata=json_field(key="load_average", dump=lambda load: dict(zip(("before", "after"), load))),
    )
    new_warnings: list[WarningGroup] = field(default_factory=list)
    gone_warnings: list[WarningGroup] = field(default_factory=list)
    changed_warnings: list[CountChange] = field(default_factory=list)
    builds: BuildMismatch | None = None

    @property
    def load_note(self) -> str:
        """The machine's load average while each side ran, for beside any timing claim ("" when unrecorded)."""
        if not any(self.load):
            return ""
        sides = [
            f"{load['mean']:g} (max {load['max']:g}, {load['cores']} cores) while {label} ran"
            if load
            else f"not recorded while {label} ran"
            for label, load in zip((self.before, self.after), self.load)
        ]
        return "load average " + ", ".join(sides)

    def drift_by_measure(self) -> list[tuple[DriftGrowth, int]]:
        """Grown drift per (suite, test, cell, measure): the tensor that grew most, and how many grew."""
        worst: dict[tuple[str, str, str, str], tuple[DriftGrowth, int]] = {}
        for growth in self.drift:
            key = (growth.suite, growth.test, growth.cell, drift_measure(growth.figure))
            if key in worst:
                top, count = worst[key]
                worst[key] = (top if _rank(top) >= _rank(growth) else growth, count + 1)
            else:
                worst[key] = (growth, 1)
        return sorted(worst.values(), key=lambda pair: _rank(pair[0]), reverse=True)

    @property
    def broken_directions(self) -> list[Direction]:
        """The checkpoint directions that broke: each a regression of the candidate (its writer or reader changed)."""
        return [direction for direction in self.checkpoints if direction.broken]

    @property
    def regression_count(self) -> int:
        """Regressions of the candidate: confirmed test regressions plus broken checkpoint directions."""
        return len(self.regressions) + len(self.broken_directions)

    @property
    def fail_causes(self) -> list[FailCause]:
        """What of FAIL_CAUSES this diff holds: a regression, grown drift, a slowdown, grown memory, an unconfirmed
        change that could hide a regression (one never re-run alone; a failure that passed alone is
        order-dependent and does not count), a broken checkpoint direction."""
        unknown = [c for c in self.unconfirmed if c.failing.confirmation != Confirmation.PASSED_ALONE]
        found = {
            REGRESSION: self.regressions,
            GROWN_DRIFT: self.drift,
            SLOWDOWN: self.slowdowns,
            MEMORY: self.memory,
            UNCONFIRMED: unknown,
            BROKEN_DIRECTION: self.broken_directions,
        }
        return [cause for cause in FAIL_CAUSES if found[cause]]

    @property
    def prerelease(self) -> bool:
        """Whether the candidate is a nightly or rc build, reported apart from the pin bump (reports/prerelease.py)."""
        return channel_of(self.after) is not None

    @property
    def blocks(self) -> bool:
        """Whether this diff's failures may fail an exit code: a pin bump's always, a pre-release's when set to."""
        return not self.prerelease or self.settings.prerelease_blocks

    @property
    def heading(self) -> str:
        """What the summaries title this diff's verdict: a pin bump's, or a pre-release check apart from it."""
        return "Pre-release check" if self.prerelease else "Verdict"

    @property
    def prerelease_note(self) -> str:
        """For a pre-release candidate, the line saying it is apart from the bump and whether it blocks."""
        if not self.prerelease:
            return ""
        effect = "block ([report] prerelease_blocks)" if self.blocks else f"do not block ({UNBLOCK_HINT})"
        return f"{self.after} is a pre-release build, reported apart from the pin bump's verdict: its failures {effect}"

    @property
    def fails(self) -> bool:
        """What `compare` and `report --check-upgrade` exit 1 on: any of FAIL_CAUSES; newly skipped
        tests are listed (a CPU-simulation limit is one) but are no regression."""
        return bool(self.fail_causes)

    @property
    def clean(self) -> bool:
        """Nothing that fails it, and no newly skipped test either."""
        return not (self.fails or self.newly_skipped)


def diff_records(
    before: list[TestRecord],
    after: list[TestRecord],
    settings: ReportSettings,
    before_label: str,
    after_label: str,
    builds: BuildMismatch | None = None,
) -> UpgradeDiff:
    """Compare two sets of records of the same matrix (one torch version each), made by builds of
    the kinds `builds` names where they differ."""
    old, new = _by_test(before), _by_test(after)
    cells = _cells_per_test(after)
    diff = UpgradeDiff(before_label, after_label, settings, builds=builds)
    diff.only_before = len(old.keys() - new.keys())
    diff.only_after = len(new.keys() - old.keys())
    for key in (k for k in new if k in old):
        a, b = old[key], new[key]
        diff.compared += 1
        change = Change(a, b, cells[key])
        if a.status is Status.PASSED and b.status.is_failing:
            (diff.regressions if change.confirmed else diff.unconfirmed).append(change)
        elif a.status.is_failing and b.status is Status.PASSED:
            (diff.fixes if change.confirmed else diff.unconfirmed).append(change)
        elif b.status.compared_nothing and not a.status.compared_nothing:
            diff.newly_skipped.append(change)
        diff.drift.extend(_drift_growth(a, b, settings.drift_ratio))
    diff.drift.sort(key=_rank, reverse=True)
    diff.slowdowns = _slowdowns(old, new, settings.slowdown_ratio)
    peaks = tuple(figure for figure in MEMORY_PEAKS if not builds or figure not in UNCOMPARED_PEAKS)
    diff.memory = memory_growth(old, new, settings.memory_ratio, peaks)
    diff.new_warnings, diff.gone_warnings = new_and_gone(before, after)
    diff.changed_warnings = count_changes(before, after)
    return diff


def upgrade_diffs(results: RunResults) -> list[UpgradeDiff]:
    """Every torch version of the run against the run's baseline: the tests each ran on its own,
    and the checkpoint directions of the pair (reads of each other's checkpoints are those)."""
    baseline = results.own_records(results.baseline)
    diffs = []
    for version in (v.torch for v in results.versions if v.torch != results.baseline):
        builds = build_mismatch(results.version(results.baseline), results.version(version))
        diff = diff_records(baseline, results.own_records(version), results.settings, results.baseline, version, builds)
        diff.checkpoints = checkpoint_directions(results, results.baseline, version)
        diff.load = (results.version(results.baseline).load_average, results.version(version).load_average)
        diffs.append(diff)
    return sorted(diffs, key=lambda diff: diff.prerelease)  # pin bumps first, pre-release checks after


def compare_runs(old: RunResults, new: RunResults) -> list[UpgradeDiff]:
    """Run A against run B: each torch version both have; or their only versions, when each has one."""
    old_versions = [v.torch for v in old.versions]
    new_versions = [v.torch for v in new.versions]
    pairs = [(v, v) for v in new_versions if v in old_versions]
    if not pairs and len(old_versions) == len(new_versions) == 1:
        pairs = [(old_versions[0], new_versions[0])]
    if not pairs:
        raise CompareError(
            f"run {old.run_id} has torch {', '.join(old_versions)} and run {new.run_id} has {', '.join(new_versions)}: "
            "no version in common; compare runs of the same versions, or runs of one version each"
        )
    diffs = []
    for a, b in pairs:
        diff = diff_records(
            old.own_records(a),
            new.own_records(b),
            new.settings,
            f"{old.run_id} (torch {a})",
            f"{new.run_id} (torch {b})",
            build_mismatch(old.version(a), new.version(b)),
        )
        diff.load = (old.version(a).load_average, new.version(b).load_average)
        diffs.append(diff)
    return sorted(diffs, key=lambda diff: diff.prerelease)  # pin bumps first, pre-release checks after


def _key(record: TestRecord) -> tuple[str, str, str]:
    return (record.suite, record.test, record.run_cell)


def _by_test(records: list[TestRecord]) -> dict[tuple[str, str, str], TestRecord]:
    """One record per test that actually ran: the representative's own record where it is there."""
    chosen: dict[tuple[str, str, str], TestRecord] = {}
    for record in records:
        key = _key(record)
        if key not in chosen or record.ran_in is None:
            chosen[key] = record
    return chosen


def _cells_per_test(records: list[TestRecord]) -> dict[tuple[str, str, str], tuple[str, ...]]:
    cells: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for record in records:
        cells[_key(record)].append(record.cell)
    return {key: tuple(value) for key, value in cells.items()}


def grew(before: float, after: float, ratio: float) -> bool:
    """Drift grew when it became NaN, left exactly zero, or rose more than `ratio` times."""
    if math.isnan(after):
        return not math.isnan(before)
    if math.isnan(before) or after <= 0:
        return False
    return before == 0 or after > ratio * before


def _drift_growth(before: TestRecord, after: TestRecord, ratio: float) -> list[DriftGrowth]:
    found = []
    for name, new in after.figures.items():
        old = before.figures.get(name)
        if not is_drift_figure(name) or not isinstance(old, float) or not isinstance(new, float):
            continue
        if grew(abs(old), abs(new), ratio):
            found.append(DriftGrowth(after.suite, after.test, after.run_cell, name, abs(old), abs(new)))
    return found


def _rank(growth: DriftGrowth) -> tuple[float, float]:
    """Larger growth first; among growth from exactly 0 (infinite ratio), the larger value first."""
    return (growth.ratio, growth.after if not math.isnan(growth.after) else math.inf)


def _slowdowns(old: dict, new: dict, ratio: float) -> list[Slowdown]:
    """Suites slower beyond noise: see the module docstring for the rule and why."""
    passed: dict[str, list[tuple[TestRecord, TestRecord]]] = defaultdict(list)
    for key in (k for k in new if k in old):
        if old[key].status is new[key].status is Status.PASSED:
            passed[key[0]].append((old[key], new[key]))
    found = []
    for suite, records in passed.items():
        measure = "cpu" if all(_cpu(a) is not None and _cpu(b) is not None for a, b in records) else "wall"
        seconds = _cpu if measure == "cpu" else (lambda record: record.duration)
        timed = [(a, b) for a, b in records if seconds(a) >= MIN_TIMED_SECONDS]
        if len(timed) < MIN_TIMED_TESTS:
            continue
        before, after = sum(seconds(a) for a, _ in timed), sum(seconds(b) for _, b in timed)
        typical = median(seconds(b) / seconds(a) for a, b in timed)
        if after > ratio * before and typical > ratio and after - before >= MIN_SLOWDOWN_SECONDS:
            walls = (sum(a.duration for a, _ in timed), sum(b.duration for _, b in timed))
            found.append(
                Slowdown(suite, round(before, 3), round(after, 3), len(timed), typical, measure, *map(_round3, walls))
            )
    return found


def _cpu(record: TestRecord) -> float | None:
    value = record.figures.get(CPU_SECONDS)
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None
