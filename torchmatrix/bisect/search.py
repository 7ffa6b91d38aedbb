"""Binary search for the first release where a test fails, over the versions between two pins.

Each step asks for one version and is told what that version did. A version that did not
install, or installed without an importable torch, is skipped (its nearest neighbour is tried instead, as `git bisect skip` does); a flaky
or order-dependent result ends the search with that verdict, since either answer could be wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Outcome(str, Enum):
    """What one version showed for the test being bisected."""

    PASSED = "passed"
    FAILS = "fails"  # failed, and failed again alone
    FLAKY = "flaky"  # failed, then passed alone: order-dependent or flaky
    NO_VERDICT = "no verdict"  # skipped, not run, or failed without a re-run alone
    NOT_INSTALLED = "did not install"
    NOT_IMPORTABLE = "installed but does not import torch"  # skipped as NOT_INSTALLED is


@dataclass
class Bisection:
    """The search state: `candidates` between the pins, oldest first; `low`/`high` index the last
    version known good and the first known bad (-1 and len(candidates): the pins themselves)."""

    good: str
    bad: str
    candidates: list[str]
    low: int = -1
    high: int = -1
    tried: dict[str, tuple[Outcome, str]] = field(default_factory=dict)
    stopped: str | None = None  # the version whose result ended the search without an answer

    def __post_init__(self) -> None:
        self.high = len(self.candidates)

    def next_version(self) -> str | None:
        """The untried version nearest the middle of the open range; None when the search is over."""
        if self.stopped is not None:
            return None
        middle = (self.low + self.high) // 2
        inside = [i for i in range(self.low + 1, self.high) if self.candidates[i] not in self.tried]
        if not inside:
            return None
        return self.candidates[min(inside, key=lambda i: (abs(i - middle), -i))]

    def record(self, version: str, outcome: Outcome, detail: str = "") -> None:
        """Narrow the range with what `version` did (`detail`: the root cause, or pip's reason)."""
        self.tried[version] = (outcome, detail)
        index = self.candidates.index(version)
        if outcome is Outcome.PASSED:
            self.low = index
        elif outcome is Outcome.FAILS:
            self.high = index
        elif outcome in (Outcome.FLAKY, Outcome.NO_VERDICT):
            self.stopped = version

    @property
    def last_good(self) -> str:
        return self.good if self.low < 0 else self.candidates[self.low]

    @property
    def first_bad(self) -> str:
        return self.bad if self.high >= len(self.candidates) else self.candidates[self.high]

    @property
    def untested_between(self) -> list[str]:
        """Versions between the last good and the first bad that could not be tried (did not install or import)."""
        return self.candidates[self.low + 1 : self.high]
