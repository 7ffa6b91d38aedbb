"""How a test came out, in the one vocabulary every module and report uses.

`Status` is what pytest reported for a test (or, for a failure that only the CPU simulation causes,
that it hit a CPU-simulation limit), `Confirmation` what re-running a failed test alone showed. Both
are str-valued, so results.json, JUnit files and event logs spell them as plain words.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class Mark:
    """How a grid shows a suite in a cell: an emoji in summary.md, a symbol on a coloured CSS class in summary.html."""

    emoji: str
    symbol: str
    css: str


class Status(str, Enum):
    """A test's outcome, as pytest and the JUnit testcase report it.

    SIMULATION_LIMIT is a failure that only ranks simulated on CPU with gloo cause (the known limits
    are in torchmatrix.ranks.simulation_limits): neither a failure of the stack nor a pass, JUnit
    writes it as a skip of its own type.
    """

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    SIMULATION_LIMIT = "CPU-simulation limit"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def parse(cls, value: object, where: str) -> Status:
        """A status read from a file another process or person wrote; anything else is a ValueError
        naming `where` and the words allowed."""
        try:
            return cls(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where} {value!r} is not one of {', '.join(s.value for s in cls)}") from None

    @classmethod
    def worst_first(cls) -> tuple[Status, ...]:
        """Every status, the one that decides a suite's mark first: error, failed, CPU-simulation limit,
        passed, skipped."""
        return (cls.ERROR, cls.FAILED, cls.SIMULATION_LIMIT, cls.PASSED, cls.SKIPPED)

    @classmethod
    def worst(cls, statuses: Iterable[str]) -> Status | None:
        """The status that stands for all of `statuses` (a suite, a cell); None when there are none."""
        seen = set(statuses)
        return next((status for status in cls.worst_first() if status in seen), None)

    @property
    def is_failing(self) -> bool:
        """Failed or errored: what the exit code, the failure sections and confirmation re-runs count."""
        return self in (Status.FAILED, Status.ERROR)

    @property
    def compared_nothing(self) -> bool:
        """Skipped, or stopped by a CPU-simulation limit: the test checked nothing of the stack."""
        return self in (Status.SKIPPED, Status.SIMULATION_LIMIT)

    @property
    def column(self) -> str:
        """The word that heads its count in totals tables and terminal lines."""
        return {Status.ERROR: "errors", Status.SIMULATION_LIMIT: "CPU-simulation limits"}.get(self, self.value)

    @property
    def mark(self) -> Mark:
        """How the grids show a suite whose worst test came out this way."""
        return _MARKS[self]


_MARKS = {
    status: Mark(emoji, symbol, css)
    for status, emoji, symbol, css in (
        (Status.PASSED, "✅", "✓", "passed"),
        (Status.FAILED, "❌", "✗", "failed"),
        (Status.ERROR, "💥", "!", "error"),
        (Status.SKIPPED, "⏭️", "–", "skipped"),
        (Status.SIMULATION_LIMIT, "🖥️", "≈", "simulation-limit"),
    )
}
# The grids' marks that no single status gives: a pass that skipped some tests, failures that all
# passed when re-run alone, a suite the cell did not run.
PARTLY_SKIPPED = Mark("☑️", "✓", "partly-skipped")
ORDER_DEPENDENT = Mark("⚠️", "?", "order-dependent")
NOT_RUN = Mark("·", "·", "none")


def grid_legend() -> list[tuple[Mark, str]]:
    """Every mark the grids show, in the order a suite's worst test decides it, with its meaning in words."""
    return [
        (Status.ERROR.mark, "error: a test errored (its setup failed, its process died or hung)"),
        (Status.FAILED.mark, "failed"),
        (ORDER_DEPENDENT, "failed in the run but passed when re-run alone (order-dependent or flaky)"),
        (Status.SIMULATION_LIMIT.mark, "CPU-simulation limit: a failure only ranks simulated on CPU cause"),
        (Status.PASSED.mark, "all passed"),
        (PARTLY_SKIPPED, "passed, with some tests skipped"),
        (Status.SKIPPED.mark, "skipped: every test skipped, each with its reason"),
        (NOT_RUN, "not run: the suite has no run in this cell"),
    ]


def legend_markdown() -> str:
    """The grids' marks as the documentation lists them: summary.md's emoji, summary.html's symbol
    (on its colour) and the meaning in words, so the legend reads without an emoji font."""
    rows = ["| summary.md | summary.html | means |", "|---|---|---|"]
    rows += [f"| {mark.emoji} | `{mark.symbol}` | {meaning} |" for mark, meaning in grid_legend()]
    return "\n".join(rows)


def count(n: int, singular: str, plural: str | None = None) -> str:
    """`1 cell`, `3 cells`, `2 fixes`: a number with its noun, as the terminal lines and both pages word them."""
    return f"{n} {singular if n == 1 else plural or singular + 's'}"


def tally(totals: Mapping[str, int]) -> str:
    """`12 passed, 1 failed, 0 errors, 3 skipped`: counts per status as the terminal lines say them; CPU-simulation
    limits only where there are any (a GPU run has none, and totals counted before they existed lack the key)."""
    shown = [status for status in Status if status is not Status.SIMULATION_LIMIT or totals.get(status)]
    return ", ".join(f"{totals[status]} {status.column}" for status in shown)


class Confirmation(str, Enum):
    """What re-running a failed test alone showed (torchmatrix.run.confirmation); files spell it as its
    value, and "" where a test has none (it passed, or confirmation was off), which reads back as None."""

    FAILS_ALONE = "fails alone"
    PASSED_ALONE = "passed alone"
    SKIPPED_ALONE = "skipped alone"
    NOT_RERUN = "not re-run"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def description(self) -> str:
        return {
            "fails alone": "fails alone",
            "passed alone": "passed alone (order-dependent or flaky)",
            "skipped alone": "skipped alone (depends on an earlier test)",
            "not re-run": "not re-run alone (unconfirmed)",
        }[self.value]

    @classmethod
    def parse(cls, value: object, where: str) -> Confirmation | None:
        """A confirmation read from a file another process or person wrote ("" is none); anything
        else is a ValueError naming `where` and the words allowed."""
        if value == "" or value is None:
            return None
        try:
            return cls(value)
        except (TypeError, ValueError):
            allowed = ", ".join(repr(word) for word in ("", *(verdict.value for verdict in cls)))
            raise ValueError(f"{where} {value!r} is not one of: {allowed}") from None

    @staticmethod
    def written(confirmation: Confirmation | None) -> str:
        """How JSON and JUnit files spell a confirmation: its value, "" for none."""
        return "" if confirmation is None else confirmation.value

    @staticmethod
    def describe(confirmation: Confirmation | None) -> str:
        """Words for a recorded confirmation; none (a run with confirmation off) reads as not re-run."""
        return (confirmation or Confirmation.NOT_RERUN).description
