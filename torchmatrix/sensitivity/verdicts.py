"""What one suite did in each cell of a sensitivity run, read back from the per-cell JUnit files.

A failure's JUnit message is its root cause line, which for a suite's assertion is only the
headline ("cell …: checkpointing changed buffers"); the per-rank lines that name what differs
follow it in the failure's text, where pytest marks the exception's lines with `E`. A failure
raised while the mutant's own code ran (one of its frames in a traceback of the text), or a test
that errored outside its call, is a crash of the mutant: it did not break what it was meant to.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

from torchmatrix.messages.root_cause import group_key
from torchmatrix.reports.junit import test_of_testcase

MESSAGE_WIDTH = 150
RAISED_LINE = re.compile(r"^E(?:\s+(.*))?$")
RANK_LINE = re.compile(r"^(?:every rank|across ranks|rank \d+): ")
FRAME_FILE = re.compile(r'File "([^"]+)", line \d+')


@dataclass(frozen=True)
class SuiteFailure:
    """One failed or errored test: its root cause line, the per-rank lines of what differs, and
    whether the mutant itself crashed there."""

    test: str
    root_cause: str
    rank_lines: tuple[str, ...] = ()
    crashed: bool = False

    def says(self) -> frozenset[str]:
        """What the failure says, comparable between runs: its per-rank lines (else its root cause),
        with ports, addresses, temporary paths and pids blanked."""
        return frozenset(group_key(line) for line in self.rank_lines or (self.root_cause,))

    def telling_line(self, known: frozenset[str] = frozenset()) -> str:
        """The failure in one line: the test and its first per-rank line not in `known` (else its root cause)."""
        fresh = [line for line in self.rank_lines if group_key(line) not in known]
        line = fresh[0] if fresh else self.root_cause.removeprefix("AssertionError: ") or "(no message)"
        line = line if len(line) <= MESSAGE_WIDTH else line[: MESSAGE_WIDTH - 1] + "…"
        return f"{self.test.split('[', 1)[0]}: {line}"


@dataclass
class CellResult:
    """The suite's tests in one cell: which failed, and why those that skipped did."""

    failures: list[SuiteFailure] = field(default_factory=list)
    skip_reasons: list[str] = field(default_factory=list)
    skipped_tests: dict[str, str] = field(default_factory=dict)
    """Why each skipped test skipped, under its name with its parameters and under its bare name."""
    ran: int = 0

    @property
    def skipped(self) -> str | None:
        """Why the suite skipped this cell, when it skipped every test there (None when any ran)."""
        return self.skip_reasons[0] if self.skip_reasons and not self.ran else None


def raised_rank_lines(text: str) -> tuple[str, ...]:
    """The per-rank lines (`rank 0: …`, `every rank: …`) among the exception lines of a failure's text."""
    raised = ((match.group(1) or "").strip() for line in text.splitlines() if (match := RAISED_LINE.match(line)))
    return tuple(line for line in raised if RANK_LINE.match(line))


def raised_in(text: str, sources: tuple[str, ...]) -> bool:
    """Whether a traceback in `text` has a frame in a file whose path ends with one of `sources`."""
    return any(path.replace("\\", "/").endswith(sources) for path in FRAME_FILE.findall(text))


def read_cells(version_dir: Path, suite: str, mutant_sources: tuple[str, ...] = ()) -> dict[str, CellResult]:
    """Per cell id, what `suite`'s tests did there, from `<version_dir>/<cell id>.xml`; a failure
    raised with a frame in one of `mutant_sources` (path endings) counts as the mutant's crash."""
    cells = {}
    for report in sorted(version_dir.glob("*.xml")):
        result = cells[report.stem] = CellResult()
        for case in ElementTree.parse(report).iter("testcase"):
            if case.get("classname") != suite:
                continue
            problem = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
            if problem is None:
                result.ran += 1
            elif problem.tag == "skipped":
                reason = problem.get("message") or "no reason given"
                result.skip_reasons.append(reason)
                test = test_of_testcase(case.get("name", ""))
                result.skipped_tests.setdefault(test, reason)
                result.skipped_tests.setdefault(test.split("[", 1)[0], reason)
            else:
                result.ran += 1
                test = test_of_testcase(case.get("name", ""))
                text = problem.text or ""
                crashed = problem.tag == "error" or bool(mutant_sources) and raised_in(text, mutant_sources)
                result.failures.append(
                    SuiteFailure(test, problem.get("message") or "", raised_rank_lines(text), crashed)
                )
    return cells


def new_failures(found: list[SuiteFailure], baseline: list[SuiteFailure]) -> list[SuiteFailure]:
    """The failures of a mutant run that the unmutated run did not have: a test that passed there,
    or one that failed there too but now says something it did not."""
    before = {failure.test: failure.says() for failure in baseline}
    return [failure for failure in found if failure.test not in before or not failure.says() <= before[failure.test]]
