"""Warnings new on the candidate and warnings gone, across the whole version, grouped like root causes.

A warning is its (category, module, normalised message): one the baseline raised anywhere is not
new on the candidate wherever it appears. Deprecations (DeprecationWarning, FutureWarning,
PendingDeprecationWarning) come first: they are what the next bump will break.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from torchmatrix.reports.records import TestRecord

DEPRECATIONS = ("DeprecationWarning", "FutureWarning", "PendingDeprecationWarning")


@dataclass(frozen=True)
class WarningGroup:
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

    def to_json(self) -> dict:
        return {
            "category": self.category,
            "module": self.module,
            "message": self.message,
            "count": self.count,
            "tests": list(self.tests),
            "cells": list(self.cells),
        }


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
