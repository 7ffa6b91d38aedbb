"""Known failures: `[[known_failure]]` entries of matrix.toml, upstream bugs a matrix expects.

A stack that trains where a torch release is broken (an open pytorch issue, a reproducer filed)
still wants every other cell green and this one watched: its tests run, report "expected failure"
with the reason instead of red, and one that passes says so, so the entry can go once a release
fixes it. Torch-free: the runner matches entries to cells, the plugin marks the tests.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchmatrix.matrix.builtin_suites import BUILTIN_SUITES
from torchmatrix.matrix.cells import Cell, matches_entry
from torchmatrix.user_error import UserError

KEYS = ("test", "reason", "torch")
"""An entry's own keys; every other key names an axis, matched as `[[exclude]]` matches."""


class KnownFailureError(UserError, ValueError):
    """An entry that cannot be read: which key, what is wrong, what to write instead."""

    def __init__(self, key: str, problem: str, fix: str):
        super().__init__(f"{key}: {problem}; {fix}")
        self.key, self.problem, self.fix = key, problem, fix


@dataclass(frozen=True)
class KnownFailure:
    """Tests (`suite::test`, globs allowed) expected to fail in the cells whose axes match `cells`,
    on the torch versions in `torch` (every version when empty), for `reason`."""

    tests: tuple[str, ...]
    reason: str
    torch: tuple[str, ...]
    cells: Mapping[str, Any]

    def applies(self, cell: Cell, torch: str, release: str = "") -> bool:
        """Whether this entry covers `cell` under torch `torch` (a label of matrix.toml, "system"
        included), whose build is `release` (2.13.0 for a `system` that is 2.13.0+cpu)."""
        named = not self.torch or torch in self.torch or bool(release) and release in self.torch
        return named and matches_entry(self.cells, cell)


def read_known_failure(entry: dict, axes: Mapping[str, Any], suites: tuple[str, ...]) -> KnownFailure:
    """One `[[known_failure]]` table, checked; KnownFailureError names the key and the fix."""
    test, reason = entry.get("test"), entry.get("reason")
    tests = test if isinstance(test, list) else [test]
    if not tests or not all(isinstance(name, str) and "::" in name for name in tests):
        raise KnownFailureError(
            "test",
            "missing or not 'SUITE::TEST'",
            "name the tests the bug fails (a string or a list), globs allowed, e.g. 'grad_ckpt::*'",
        )
    for name in tests:
        suite = name.partition("::")[0]
        if any(fnmatch.fnmatchcase(known, suite) for known in suites):
            continue
        if suite in BUILTIN_SUITES:
            raise KnownFailureError(
                "test",
                f"{name!r} names the built-in suite {suite}, which this matrix does not run",
                f"drop {name!r} from this entry (the whole entry if it names no other test), or add [suites.{suite}]",
            )
        raise KnownFailureError("test", f"{name!r} names no suite of this matrix", f"use one of: {', '.join(suites)}")
    if not isinstance(reason, str) or not reason.strip():
        raise KnownFailureError(
            "reason", "missing", "say which upstream bug fails these tests (an issue or a reproducer)"
        )
    torch = entry.get("torch", [])
    if not isinstance(torch, list) or not all(isinstance(version, str) for version in torch):
        raise KnownFailureError(
            "torch", "must be a list of versions", 'write e.g. ["2.13.0"], or leave it out for every version'
        )
    cells = {key: value for key, value in entry.items() if key not in KEYS}
    unknown = [key for key in cells if key not in axes]
    if unknown:
        raise KnownFailureError(
            unknown[0], "is not an axis", f"name axes from [axes] ({', '.join(axes)}) or {', '.join(KEYS)}"
        )
    return KnownFailure(tuple(tests), reason.strip(), tuple(torch), cells)


def expected_failures(
    entries: tuple[KnownFailure, ...], suite: str, cell: Cell, torch: str, release: str = ""
) -> tuple[tuple[str, str], ...]:
    """(test glob without the suite, reason) of every entry covering this suite's run on `cell` under
    `torch`, whose build is `release`."""
    return tuple(
        (name.partition("::")[2], entry.reason)
        for entry in entries
        if entry.applies(cell, torch, release)
        for name in entry.tests
        if fnmatch.fnmatchcase(suite, name.partition("::")[0])
    )
