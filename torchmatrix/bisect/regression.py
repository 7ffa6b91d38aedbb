"""What one bisect search looks for: a test that regressed between two pins, in the cell that ran
it, or a checkpoint direction that broke between them, whose steps need two torch versions."""

from __future__ import annotations

from dataclasses import dataclass

from torchmatrix.reports.checkpoint_directions import FORWARD, ROLLBACK


@dataclass(frozen=True)
class Regression:
    """A test that passes on the good pin and fails alone on the bad one, in the cell that ran it.

    With a `direction`, it is a cross_version read the good pin (the baseline) passed with its own
    checkpoint and the bad one broke: for a rollback, the baseline cannot read the bad pin's
    checkpoint, and each step's release writes while the baseline reads; for a forward break, the
    bad pin cannot read the baseline's, and the baseline writes while each step's release reads.
    """

    suite: str
    test: str
    cell: str
    axes: dict[str, str]
    good: str
    bad: str
    root_cause: str
    direction: str | None = None

    @property
    def name(self) -> str:
        return self.named([self.cell])

    def named(self, cells: list[str]) -> str:
        """The regression's name over `cells`: the cells a search of the same failure judges."""
        where = ", ".join(cells)
        if self.direction == ROLLBACK:
            return f"rollback [{where}] (torch {self.good} reading each release's checkpoint)"
        if self.direction == FORWARD:
            return f"forward [{where}] (each release reading torch {self.good}'s checkpoint)"
        return f"{self.suite}::{self.test} [{where}]"

    def writer_and_reader(self, version: str) -> tuple[str, str]:
        """Who writes and who reads the checkpoint of a direction's step on `version`."""
        return (version, self.good) if self.direction == ROLLBACK else (self.good, version)
