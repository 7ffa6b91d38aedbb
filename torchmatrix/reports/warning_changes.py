"""Warnings new on the candidate, warnings gone, and warnings raised more or less often, across the
whole version, grouped like root causes.

A warning is its (category, module, normalised message): one the baseline raised anywhere is not
new on the candidate wherever it appears. One both raised changed its count when the raises per
test the version ran (its total over the version's tests) moved by more than COUNT_FACTOR either
way: per test, so a candidate that ran fewer cells does not read as quieter; a factor, since the
counts of one test are repeatable but a warning raised once per step moves with every step count.
Deprecations (DeprecationWarning, FutureWarning, PendingDeprecationWarning) come first: they are
what the next bump will break.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from torchmatrix.json_records import JsonRecord
from torchmatrix.reports.records import TestRecord

DEPRECATIONS = ("DeprecationWarning", "FutureWarning", "PendingDeprecationWarning")
COUNT_FACTOR = 1.5


@dataclass(frozen=True)
class WarningGroup(JsonRecord):
    """One warning as a version raised it: how often, in which tests (suite::test) and cells."""

    category: str
    module: str
    message: str
    count: int
    tests: tuple[str, ...]
    cells: tuple[str, ...]

    @property
    def deprecation(self) -> bool:
        return self.category in DEPRECATIONS


def warning_groups(records: list[TestRecord]) -> dict[tuple[str, str, str], WarningGroup]:
    """Every distinct warning of these records with its total count, tests and cells."""
    counts: dict[tuple[str, str, str], int] = defaultdict(int)
    tests: dict[tuple[str, str, str], dict[str, None]] = defaultdict(dict)
    cells: dict[tuple[str, str, str], dict[str, None]] = defaultdict(dict)
    for record in records:
        for warning in record.warnings:
            key = (warning.get("category", ""), warning.get("module", ""), warning.get("message", ""))
            counts[key] += int(warning.get("count", 1))
            tests[key][f"{record.suite}::{record.test}"] = None
            cells[key][record.cell] = None
    return {key: WarningGroup(*key, counts[key], tuple(tests[key]), tuple(cells[key])) for key in counts}


def new_and_gone(before: list[TestRecord], after: list[TestRecord]) -> tuple[list[WarningGroup], list[WarningGroup]]:
    """Warnings only the candidate raised, and warnings only the baseline raised; deprecations first, then by count."""
    old, new = warning_groups(before), warning_groups(after)

    def ordered(groups: list[WarningGroup]) -> list[WarningGroup]:
        return sorted(groups, key=lambda g: (not g.deprecation, -g.count, g.module, g.message))

    return ordered([g for key, g in new.items() if key not in old]), ordered(
        [g for key, g in old.items() if key not in new]
    )


@dataclass(frozen=True)
class CountChange:
    """A warning both versions raised whose raises per test moved by more than COUNT_FACTOR."""

    before: WarningGroup
    after: WarningGroup
    tests_before: int
    tests_after: int

    @property
    def per_test_before(self) -> float:
        return self.before.count / max(self.tests_before, 1)

    @property
    def per_test_after(self) -> float:
        return self.after.count / max(self.tests_after, 1)

    @property
    def ratio(self) -> float:
        """How many times as often the candidate raised it per test."""
        return self.per_test_after / self.per_test_before if self.per_test_before else float("inf")

    def to_json(self) -> dict:
        """A view of both groups, not a field dump: the warning, then each side's count and tests."""
        return {
            "category": self.after.category,
            "module": self.after.module,
            "message": self.after.message,
            "count_before": self.before.count,
            "count_after": self.after.count,
            "tests_before": self.tests_before,
            "tests_after": self.tests_after,
            "ratio": round(self.ratio, 3),
        }


def count_changes(before: list[TestRecord], after: list[TestRecord], factor: float = COUNT_FACTOR) -> list[CountChange]:
    """Warnings both raised whose raises per test rose or fell by more than `factor`; deprecations
    first, then the largest change either way."""
    old, new = warning_groups(before), warning_groups(after)
    changes = [CountChange(old[key], new[key], len(before), len(after)) for key in new.keys() & old.keys()]
    changed = [c for c in changes if c.ratio > factor or c.ratio < 1 / factor]
    return sorted(
        changed, key=lambda c: (not c.after.deprecation, -max(c.ratio, 1 / c.ratio), c.after.module, c.after.message)
    )
