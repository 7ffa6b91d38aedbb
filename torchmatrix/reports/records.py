"""What a run's results are: one record per (torch version, cell, suite, test), the run they belong
to, and the questions every report asks of them (totals, failures by root cause, skip reasons)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from torchmatrix.env.devices import Environment
from torchmatrix.json_records import JsonRecord, from_json, json_field, to_json
from torchmatrix.matrix.config import ReportSettings
from torchmatrix.messages.consequences import CONSEQUENCE_OF, causes_named, under_their_causes
from torchmatrix.messages.cross_version import READ_TEST
from torchmatrix.messages.cross_version import SUITE as CROSS_VERSION
from torchmatrix.messages.root_cause import group_key
from torchmatrix.status import Confirmation, Status
from torchmatrix.user_error import UserError

DRIFT_WORDS = {"abs", "rel", "drift", "diff", "err", "error", "ulp"}


class ResultsError(UserError):
    """A path that holds no readable run; the message says what to pass instead."""


def _figures_json(figures: dict) -> dict:
    return {name: _json_number(value) for name, value in figures.items()}


def _figures_read(figures: dict) -> dict:
    return {name: figure_value(value) for name, value in figures.items()}


@dataclass(frozen=True)
class TestRecord(JsonRecord):
    """One test of one suite in one cell under one torch version, as its JUnit testcase reports it."""

    __test__ = False  # a record of a test, not a test class for pytest to collect

    torch: str
    cell: str
    suite: str
    test: str
    status: Status
    duration: float
    message: str = ""
    text: str = ""
    ran_in: str | None = None
    figures: dict = field(
        default_factory=dict, hash=False, compare=False, metadata=json_field(dump=_figures_json, load=_figures_read)
    )
    confirmation: Confirmation | None = field(default=None, metadata=json_field(dump=Confirmation.written))
    confirmation_note: str = ""
    """What the re-run alone showed (its status and message), or why the failure was not re-run."""
    warnings: tuple[dict, ...] = field(default=(), hash=False, compare=False)
    """Each distinct warning the test raised on any rank or in pytest: category, module, message, count."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status.parse(self.status, "tests[].status"))
        object.__setattr__(self, "confirmation", Confirmation.parse(self.confirmation, "tests[].confirmation"))

    @property
    def run_cell(self) -> str:
        """The cell that actually ran the test (a representative cell shares its result with others)."""
        return self.ran_in or self.cell

    @property
    def follows_from(self) -> tuple[str, ...]:
        """The tests of its suite and cell whose failure this test's failure follows from (CONSEQUENCE_OF)."""
        return causes_named(self.figures.get(CONSEQUENCE_OF))

    @property
    def reads_writer(self) -> str | None:
        """The torch version whose checkpoint this test read (a cross_version read), else None: such
        a result belongs to the pair of versions, not to the one that ran it."""
        prefix = f"{READ_TEST}[writer="
        if self.suite != CROSS_VERSION or not self.test.startswith(prefix) or not self.test.endswith("]"):
            return None
        return self.test[len(prefix) : -1]


@dataclass
class RootCause:
    """Failed and errored tests (or CPU-simulation limits) that share one root cause line, across cells and torch versions."""

    line: str
    failures: list[tuple[TestRecord, list[str]]] = field(default_factory=list)
    consequences: list[tuple[TestRecord, list[str]]] = field(default_factory=list)
    """Failures that follow from one of `failures` in the same cell (a resumed loss after a piece the load
    left behind): listed under this cause, never as causes of their own."""

    @property
    def tests(self) -> int:
        """Testcases, as the totals count them (consequences included): once per cell a shared result stands for."""
        return sum(len(cells) for _, cells in self.failures + self.consequences)

    @property
    def cells(self) -> list[str]:
        return list(dict.fromkeys(cell for _, cells in self.failures + self.consequences for cell in cells))

    @property
    def versions(self) -> list[str]:
        return list(dict.fromkeys(record.torch for record, _ in self.failures + self.consequences))

    @property
    def consequence_tests(self) -> int:
        """Testcases that follow from this cause, counted as `tests` counts them."""
        return sum(len(cells) for _, cells in self.consequences)


@dataclass
class SkipReason:
    """Skipped tests that give one reason, across cells and torch versions."""

    line: str
    records: list[TestRecord] = field(default_factory=list)

    @property
    def cells(self) -> list[str]:
        return list(dict.fromkeys(record.cell for record in self.records))

    @property
    def versions(self) -> list[str]:
        return list(dict.fromkeys(record.torch for record in self.records))


ENVIRONMENT_KEYS = ("build", "git_version", "cuda_version", "device", "gpu_count")
"""results.json's keys for a version's environment, flat beside the version as every schema wrote them."""


@dataclass(frozen=True)
class VersionInfo(JsonRecord):
    """One torch version of the run: the environment its cells ran in, as the run recorded it, and what was planned."""

    torch: str
    environment: Environment = field(default_factory=Environment)
    planned_cells: tuple[str, ...] = ()
    missing_cells: tuple[str, ...] = ()
    filters: dict = field(default_factory=dict, hash=False, compare=False)
    pool_starts: int | None = None
    load_average: dict = field(default_factory=dict, hash=False, compare=False)

    def to_json(self) -> dict:
        """results.json's shape: the environment's build, device and GPUs as keys of the version."""
        environment = self.environment
        recorded = (environment.torch, environment.git_version, environment.cuda_version or "")
        written = {key: value for key, value in to_json(self).items() if key not in ("torch", "environment")}
        return {
            "torch": self.torch,
            **dict(zip(ENVIRONMENT_KEYS, (*recorded, environment.description, environment.gpu_count))),
            **written,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VersionInfo:
        """A version as results.json holds it; its environment from the words `to_json` wrote."""
        words = [data.get(key, "") for key in ENVIRONMENT_KEYS[:4]]
        wrong = next((key for key, value in zip(ENVIRONMENT_KEYS, words) if not isinstance(value, str)), None)
        if wrong is not None:
            raise TypeError(f"versions[].{wrong} {data[wrong]!r} is not text")
        version = from_json(cls, {key: value for key, value in data.items() if key not in ENVIRONMENT_KEYS})
        return replace(version, environment=Environment.recorded(*words))


@dataclass
class RunResults:
    """Everything a report needs about one run directory."""

    run_id: str
    created: str
    hosts: list[str]
    matrix_path: str
    matrix_sha256: str
    baseline: str
    settings: ReportSettings
    versions: list[VersionInfo]
    cells: dict[str, dict[str, str]]
    tests: list[TestRecord]

    @property
    def suites(self) -> list[str]:
        return list(dict.fromkeys(record.suite for record in self.tests))

    @property
    def axes(self) -> dict[str, list[str]]:
        """Every axis and the values it takes in this run, in first-seen order."""
        axes: dict[str, dict[str, None]] = {}
        for values in self.cells.values():
            for axis, value in values.items():
                axes.setdefault(axis, {})[value] = None
        return {axis: list(values) for axis, values in axes.items()}

    def version(self, torch: str) -> VersionInfo:
        return next(v for v in self.versions if v.torch == torch)

    def records(self, torch: str) -> list[TestRecord]:
        return [record for record in self.tests if record.torch == torch]

    def own_records(self, torch: str | None = None) -> list[TestRecord]:
        """The tests a version ran on its own (every version's when None): its reads of another
        version's checkpoints left out, since a pair of versions owns those."""
        return [r for r in self.tests if r.reads_writer is None and (torch is None or r.torch == torch)]

    def totals(self, torch: str | None = None) -> dict[Status, int]:
        """Testcases per status, worst first, as the merged JUnit file counts them."""
        counts = dict.fromkeys(Status.worst_first(), 0)
        for record in self.tests:
            if torch is None or record.torch == torch:
                counts[record.status] += 1
        return counts

    def statuses(self) -> dict[tuple[str, str, str], Status]:
        """(torch, cell, suite) -> the suite's status in that cell: error, else failed, else passed, else
        skipped; reads of another version's checkpoints are the pair's (checkpoint_directions), not here."""
        found: dict[tuple[str, str, str], set[Status]] = {}
        for record in self.own_records():
            found.setdefault((record.torch, record.cell, record.suite), set()).add(record.status)
        return {key: Status.worst(seen) for key, seen in found.items()}

    def failures(self) -> list[tuple[TestRecord, list[str]]]:
        """Failed and errored tests, once per cell that ran them, with every cell that shares the result."""
        return self._shared(lambda status: status.is_failing)

    def root_causes(self) -> list[RootCause]:
        """The failures grouped by root cause (what differs between runs of it blanked), most tests first."""
        return _by_root_cause(self.failures())

    def simulation_limits(self) -> list[RootCause]:
        """The tests that hit a CPU-simulation limit, grouped like failures by their message (which
        holds the root cause and the hint), most tests first."""
        return _by_root_cause(self._shared(lambda status: status is Status.SIMULATION_LIMIT))

    def _shared(self, wanted) -> list[tuple[TestRecord, list[str]]]:
        """Tests of the `wanted` statuses, once per cell that ran them, with every cell that shares the result."""
        grouped: dict[tuple[str, str, str, str], tuple[TestRecord, list[str]]] = {}
        for record in self.tests:
            if wanted(record.status):
                key = (record.torch, record.suite, record.test, record.run_cell)
                grouped.setdefault(key, (record, []))[1].append(record.cell)
        return list(grouped.values())

    def partly_skipped(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        """(torch, cell, suite) that passed with some tests skipped -> (skipped, tests): a green mark
        that checked less than the suite has."""
        counts: dict[tuple[str, str, str], list[int]] = {}
        for record in self.own_records():
            tally = counts.setdefault((record.torch, record.cell, record.suite), [0, 0])
            tally[0] += record.status is Status.SKIPPED
            tally[1] += 1
        statuses = self.statuses()
        return {
            key: (skipped, tests)
            for key, (skipped, tests) in counts.items()
            if statuses[key] is Status.PASSED and skipped
        }

    def skip_reasons(self) -> list[SkipReason]:
        """Skipped tests grouped by their reason, most tests first."""
        reasons: dict[str, SkipReason] = {}
        for record in self.tests:
            if record.status is Status.SKIPPED:
                line = record.message or "(no reason given)"
                reasons.setdefault(line, SkipReason(line)).records.append(record)
        return sorted(reasons.values(), key=lambda reason: -len(reason.records))

    def order_dependent(self) -> set[tuple[str, str, str]]:
        """(torch, cell, suite) whose failures all passed when re-run alone: order-dependent or flaky."""
        confirmations: dict[tuple[str, str, str], set[Confirmation | None]] = {}
        for record in self.own_records():
            if record.status.is_failing:
                confirmations.setdefault((record.torch, record.cell, record.suite), set()).add(record.confirmation)
        return {key for key, seen in confirmations.items() if seen == {Confirmation.PASSED_ALONE}}


def _by_root_cause(failures: list[tuple[TestRecord, list[str]]]) -> list[RootCause]:
    """Failures grouped by their message with what differs between runs of it blanked, most tests first;
    a failure that follows from another failing test of its suite and cell joins that test's cause
    (through chains; one whose causes are all consequences in a cycle stands as its own)."""
    causes: dict[str, RootCause] = {}
    groups = under_their_causes(
        failures,
        key=lambda failure: (failure[0].torch, failure[0].run_cell, failure[0].suite, failure[0].test),
        causes=lambda failure: [
            (failure[0].torch, failure[0].run_cell, failure[0].suite, test) for test in failure[0].follows_from
        ],
    )
    for (record, cells), following in groups:
        line = record.message or "(no message)"
        blanked = line.replace(record.run_cell, "<cell>") if record.run_cell else line  # suites name their cell
        cause = causes.setdefault(group_key(blanked), RootCause(line))
        cause.failures.append((record, cells))
        cause.consequences += following
    return sorted(causes.values(), key=lambda cause: -cause.tests)


def is_drift_figure(name: str) -> bool:
    """Drift figures are named after what they measure: `grad_max_abs/<param>`, `loss_max_abs`, `logits_drift`."""
    return bool(DRIFT_WORDS.intersection(re.split(r"[^a-z0-9]+", drift_measure(name).lower())))


def drift_measure(name: str) -> str:
    """What a drift figure measures, without the tensor it was measured on: `grad_max_abs/layer0.wq` -> `grad_max_abs`."""
    return name.split("/", 1)[0]


def figure_value(value: object) -> float | str:
    """A recorded figure as a number when it is one (non-finite numbers included), else as text."""
    try:
        return float(value)
    except OverflowError:  # an integer beyond any float (400 digits): infinite, as a float would read it
        return math.inf if value > 0 else -math.inf
    except (TypeError, ValueError):
        return str(value)


def _json_number(value: float | str) -> float | str:
    """JSON has no NaN or infinity: those are written as the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
