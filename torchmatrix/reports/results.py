"""A run directory read back into records: one per (torch version, cell, suite, test), and results.json.

Everything comes from the self-describing per-cell JUnit files (or the merged junit.xml when
only that was kept) plus each version's plan.json, so a run directory copied out of CI reads
the same as one on the machine that made it. The JSON form is versioned: see SCHEMA_VERSION.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from junitparser import TestSuite

from torchmatrix.matrix.config import ReportSettings
from torchmatrix.messages.run_plan import PlanFileError, RunPlan, read_plan
from torchmatrix.ranks.root_cause import group_key
from torchmatrix.reports import junit
from torchmatrix.status import Confirmation, Status

SCHEMA = "torchmatrix.results"
SCHEMA_VERSION = 2
FILE_NAME = "results.json"
DRIFT_WORDS = {"abs", "rel", "drift", "diff", "err", "error", "ulp"}
CONFIRMATIONS = ("", *(confirmation.value for confirmation in Confirmation))


class ResultsError(Exception):
    """A path that holds no readable run; the message says what to pass instead."""


@dataclass(frozen=True)
class TestRecord:
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
    figures: dict = field(default_factory=dict, hash=False, compare=False)
    confirmation: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status.parse(self.status, "tests[].status"))

    @property
    def run_cell(self) -> str:
        """The cell that actually ran the test (a representative cell shares its result with others)."""
        return self.ran_in or self.cell

    def to_json(self) -> dict:
        return {
            "torch": self.torch,
            "cell": self.cell,
            "suite": self.suite,
            "test": self.test,
            "status": self.status.value,
            "duration": self.duration,
            "message": self.message,
            "text": self.text,
            "ran_in": self.ran_in,
            "figures": {name: _json_number(value) for name, value in self.figures.items()},
            "confirmation": self.confirmation,
        }

    @classmethod
    def from_json(cls, data: dict) -> TestRecord:
        figures = {name: _figure_value(value) for name, value in data.get("figures", {}).items()}
        return cls(**{**data, "figures": figures})


@dataclass
class RootCause:
    """Failed and errored tests that share one root cause line, across cells and torch versions."""

    line: str
    failures: list[tuple[TestRecord, list[str]]] = field(default_factory=list)

    @property
    def tests(self) -> int:
        """Testcases, as the totals count them: once per cell a shared result stands for."""
        return sum(len(cells) for _, cells in self.failures)

    @property
    def cells(self) -> list[str]:
        return list(dict.fromkeys(cell for _, cells in self.failures for cell in cells))

    @property
    def versions(self) -> list[str]:
        return list(dict.fromkeys(record.torch for record, _ in self.failures))


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


@dataclass(frozen=True)
class VersionInfo:
    """One torch version of the run: its exact build, the device it ran on, what was planned."""

    torch: str
    build: str = ""
    git_version: str = ""
    cuda_version: str = ""
    device: str = ""
    gpu_count: int = 0
    planned_cells: tuple[str, ...] = ()
    missing_cells: tuple[str, ...] = ()
    filters: dict = field(default_factory=dict, hash=False, compare=False)
    pool_starts: int | None = None

    def to_json(self) -> dict:
        return {
            "torch": self.torch,
            "build": self.build,
            "git_version": self.git_version,
            "cuda_version": self.cuda_version,
            "device": self.device,
            "gpu_count": self.gpu_count,
            "planned_cells": list(self.planned_cells),
            "missing_cells": list(self.missing_cells),
            "filters": self.filters,
            "pool_starts": self.pool_starts,
        }

    @classmethod
    def from_json(cls, data: dict) -> VersionInfo:
        return cls(
            **{**data, "planned_cells": tuple(data["planned_cells"]), "missing_cells": tuple(data["missing_cells"])}
        )


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

    def totals(self, torch: str | None = None) -> dict[Status, int]:
        """Testcases per status, worst first, as the merged JUnit file counts them."""
        counts = dict.fromkeys(Status.worst_first(), 0)
        for record in self.tests:
            if torch is None or record.torch == torch:
                counts[record.status] += 1
        return counts

    def statuses(self) -> dict[tuple[str, str, str], Status]:
        """(torch, cell, suite) -> the suite's status in that cell: error, else failed, else passed, else skipped."""
        found: dict[tuple[str, str, str], set[Status]] = {}
        for record in self.tests:
            found.setdefault((record.torch, record.cell, record.suite), set()).add(record.status)
        return {key: Status.worst(seen) for key, seen in found.items()}

    def failures(self) -> list[tuple[TestRecord, list[str]]]:
        """Failed and errored tests, once per cell that ran them, with every cell that shares the result."""
        grouped: dict[tuple[str, str, str, str], tuple[TestRecord, list[str]]] = {}
        for record in self.tests:
            if record.status.is_failing:
                key = (record.torch, record.suite, record.test, record.run_cell)
                grouped.setdefault(key, (record, []))[1].append(record.cell)
        return list(grouped.values())

    def root_causes(self) -> list[RootCause]:
        """The failures grouped by root cause (what differs between runs of it blanked), most tests first."""
        causes: dict[str, RootCause] = {}
        for record, cells in self.failures():
            line = record.message or "(no message)"
            blanked = line.replace(record.run_cell, "<cell>") if record.run_cell else line  # suites name their cell
            key = group_key(blanked)
            causes.setdefault(key, RootCause(line)).failures.append((record, cells))
        return sorted(causes.values(), key=lambda cause: -cause.tests)

    def partly_skipped(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        """(torch, cell, suite) that passed with some tests skipped -> (skipped, tests): a green mark
        that checked less than the suite has."""
        counts: dict[tuple[str, str, str], list[int]] = {}
        for record in self.tests:
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
        confirmations: dict[tuple[str, str, str], set[str]] = {}
        for record in self.tests:
            if record.status.is_failing:
                confirmations.setdefault((record.torch, record.cell, record.suite), set()).add(record.confirmation)
        return {key for key, seen in confirmations.items() if seen == {Confirmation.PASSED_ALONE.value}}

    def to_json(self, upgrade: list[dict] | None = None) -> dict:
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "run": {
                "id": self.run_id,
                "created": self.created,
                "hosts": self.hosts,
                "matrix": {"path": self.matrix_path, "sha256": self.matrix_sha256},
                "baseline": self.baseline,
                "thresholds": {
                    "drift_ratio": self.settings.drift_ratio,
                    "slowdown_ratio": self.settings.slowdown_ratio,
                },
                "totals": self.totals(),
            },
            "versions": [{**v.to_json(), "totals": self.totals(v.torch)} for v in self.versions],
            "cells": [{"id": cell, "axes": axes} for cell, axes in self.cells.items()],
            "tests": [record.to_json() for record in self.tests],
            "upgrade": upgrade or [],
        }

    @classmethod
    def from_json(cls, data: dict) -> RunResults:
        """The run a results.json holds; anything malformed in it is a ResultsError naming the first problem."""
        if not isinstance(data, dict):
            raise ResultsError("not a JSON object; regenerate it with `python -m torchmatrix report RUN_DIR`")
        try:
            results = cls._from_json(data)
            _check_types(results)
        except (KeyError, TypeError, AttributeError, ValueError) as error:
            problem = f"missing key {error}" if isinstance(error, KeyError) else str(error)
            raise ResultsError(
                f"malformed ({problem}); regenerate it with `python -m torchmatrix report RUN_DIR`"
            ) from None
        return results

    @classmethod
    def _from_json(cls, data: dict) -> RunResults:
        if data.get("schema") != SCHEMA or data.get("schema_version") != SCHEMA_VERSION:
            raise ResultsError(
                f"not a {SCHEMA} v{SCHEMA_VERSION} file (schema {data.get('schema')!r} v{data.get('schema_version')!r}); "
                "regenerate it with `python -m torchmatrix report RUN_DIR`"
            )
        run = data["run"]
        return cls(
            run_id=run["id"],
            created=run["created"],
            hosts=run["hosts"],
            matrix_path=run["matrix"]["path"],
            matrix_sha256=run["matrix"]["sha256"],
            baseline=run["baseline"],
            settings=ReportSettings(**run["thresholds"]),
            versions=[VersionInfo.from_json({k: v for k, v in x.items() if k != "totals"}) for x in data["versions"]],
            cells={cell["id"]: cell["axes"] for cell in data["cells"]},
            tests=[TestRecord.from_json(record) for record in data["tests"]],
        )


def _check_types(results: RunResults) -> None:
    """Raise TypeError or ValueError for a value of the wrong kind, before a report trips over it."""
    texts = {"torch", "cell", "suite", "test", "message", "text", "confirmation"}
    for record in results.tests:
        for name in texts:
            if not isinstance(getattr(record, name), str):
                raise TypeError(f"tests[].{name} {getattr(record, name)!r} is not text")
        if isinstance(record.duration, bool) or not isinstance(record.duration, (int, float)):
            raise TypeError(f"tests[].duration {record.duration!r} is not a number")
        if record.ran_in is not None and not isinstance(record.ran_in, str):
            raise TypeError(f"tests[].ran_in {record.ran_in!r} is not text")
        if record.confirmation not in CONFIRMATIONS:
            raise ValueError(
                f"tests[].confirmation {record.confirmation!r} is not one of: {', '.join(map(repr, CONFIRMATIONS))}"
            )
    for version in results.versions:
        if not isinstance(version.torch, str):
            raise TypeError(f"versions[].torch {version.torch!r} is not text")
    if not isinstance(results.run_id, str) or not isinstance(results.baseline, str):
        raise TypeError("run.id and run.baseline must be text")
    for name, ratio in vars(results.settings).items():
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not (ratio > 0 and math.isfinite(ratio)):
            raise TypeError(f"run.thresholds.{name} {ratio!r} is not a positive number")


def is_drift_figure(name: str) -> bool:
    """Drift figures are named after what they measure: `grad_max_abs/<param>`, `loss_max_abs`, `logits_drift`."""
    return bool(DRIFT_WORDS.intersection(re.split(r"[^a-z0-9]+", drift_measure(name).lower())))


def drift_measure(name: str) -> str:
    """What a drift figure measures, without the tensor it was measured on: `grad_max_abs/layer0.wq` -> `grad_max_abs`."""
    return name.split("/", 1)[0]


def matrix_paths(run_dir: Path) -> list[Path]:
    """The matrix files the run's plan.json files name, existing ones only, first version first."""
    paths = []
    for plan in sorted(run_dir.glob("torch-*/plan.json")):
        path = Path(_read_plan(plan).matrix or "")
        if path.is_file() and path not in paths:
            paths.append(path)
    return paths


def load_results(path: Path, baseline: str | None = None, settings: ReportSettings | None = None) -> RunResults:
    """Read a run directory, or a results.json (a CI artifact), into RunResults."""
    if path.is_file():
        try:
            return RunResults.from_json(_read_json(path))
        except ResultsError as error:
            raise ResultsError(f"{path}: {error}") from None
    if not path.is_dir():
        raise ResultsError(f"{path} does not exist; pass a run directory (reports/<run-id>) or its results.json")
    suites = _suites(path)
    if not suites and not any(path.glob("torch-*/plan.json")):
        if (path / FILE_NAME).is_file():
            return RunResults.from_json(_read_json(path / FILE_NAME))
        raise ResultsError(f"{path} holds no JUnit reports; pass a run directory made by `python -m torchmatrix run`")
    return _from_suites(path.resolve(), suites, baseline, settings or ReportSettings())


def write_json(path: Path, results: RunResults, upgrade: list[dict]) -> Path:
    path.write_text(json.dumps(results.to_json(upgrade), indent=2, allow_nan=False) + "\n")
    return path


def _suites(run_dir: Path) -> list[TestSuite]:
    files = junit.cell_report_files(run_dir)
    if not files and (run_dir / junit.MERGED_NAME).is_file():
        files = [run_dir / junit.MERGED_NAME]
    suites = []
    for path in files:
        try:
            suites.extend(junit.read_suites(path))
        except SyntaxError as error:  # ElementTree's ParseError and lxml's XMLSyntaxError both are
            raise ResultsError(
                f"{path} is not readable JUnit XML ({error}); rerun that cell or delete the file"
            ) from None
    return suites


def _from_suites(run_dir: Path, suites: list[TestSuite], baseline: str | None, settings: ReportSettings) -> RunResults:
    plans = {plan.parent.name.removeprefix("torch-"): _read_plan(plan) for plan in run_dir.glob("torch-*/plan.json")}
    cells: dict[str, dict[str, str]] = {}
    tests: list[TestRecord] = []
    seen_versions: dict[str, dict[str, str]] = {}
    for suite in suites:
        properties = {p.name: p.value for p in suite.properties()}
        torch = properties.get("torch", "")
        cell = properties.get("cell", "")
        seen_versions.setdefault(torch, properties)
        cells.setdefault(cell, {k.removeprefix("axis."): v for k, v in properties.items() if k.startswith("axis.")})
        tests.extend(_records(suite, torch, cell, properties))
    for version, plan in plans.items():
        seen_versions.setdefault(version, _properties_of(plan.environment))
    versions = sorted(seen_versions, key=_version_key)
    planned = [cell for v in versions for cell in (plans[v].cells if v in plans else ())]
    order = {cell: i for i, cell in enumerate(dict.fromkeys([*planned, *cells]))}
    cells = {cell: cells[cell] for cell in sorted(cells, key=order.__getitem__)}
    version_rank = {v: i for i, v in enumerate(versions)}
    tests.sort(key=lambda record: (version_rank[record.torch], order[record.cell]))
    plan_sha = [p.matrix_sha256 or "" for p in plans.values()]
    return RunResults(
        run_id=run_dir.name,
        created=run_started(plans.values(), suites),
        hosts=sorted({s.hostname for s in suites if s.hostname}),
        matrix_path=next((p.matrix or "" for p in plans.values()), ""),
        matrix_sha256=plan_sha[0] if plan_sha else "",
        baseline=baseline if baseline in versions or not versions else versions[0],
        settings=settings,
        versions=[_version_info(v, seen_versions[v], plans.get(v), tests) for v in versions],
        cells=cells,
        tests=tests,
    )


def run_started(plans, suites: list[TestSuite]) -> str:
    """When the run started: the earliest start its versions' plan.json files record, else the
    earliest cell's JUnit timestamp (a run directory holding only junit.xml)."""
    recorded = [plan.started for plan in plans if plan.started]
    return min(recorded or [s.timestamp for s in suites if s.timestamp], default="")


def _properties_of(environment: dict) -> dict[str, str]:
    """A version's properties from its plan.json, for a run whose filters selected no cell."""
    keys = {
        "torch.build": "torch",
        "torch.git_version": "git_version",
        "torch.cuda_version": "cuda_version",
        "device": "device",
    }
    return {name: str(environment.get(key) or "") for name, key in keys.items()}


def _records(suite: TestSuite, torch: str, cell: str, properties: dict[str, str]) -> list[TestRecord]:
    records = []
    for case in suite:
        test = case.name.removesuffix(junit.testcase_name("", torch, cell))
        prefix = f"{case.classname}::{test}::"
        result = case.result[0] if case.result else None
        records.append(
            TestRecord(
                torch=torch,
                cell=cell,
                suite=case.classname,
                test=test,
                status=_status(case),
                duration=round(case.time or 0.0, 3),
                message=(result.message or "") if result is not None else "",
                text=(result.text or "") if result is not None else "",
                ran_in=properties.get(f"{case.classname}.ran_in"),
                confirmation=properties.get(junit.confirmation_property(case.classname, test), ""),
                figures={
                    name.removeprefix(prefix): _figure_value(value)
                    for name, value in properties.items()
                    if name.startswith(prefix)
                },
            )
        )
    return records


def _status(case) -> Status:
    if case.is_error:
        return Status.ERROR
    if case.is_failure:
        return Status.FAILED
    if case.is_skipped:
        return Status.SKIPPED
    return Status.PASSED


def _version_info(torch: str, properties: dict[str, str], plan: RunPlan | None, tests: list[TestRecord]) -> VersionInfo:
    """The version's build and device from its JUnit properties; what was planned (and never reported) from plan.json."""
    planned = plan.cells if plan else ()
    reported = {record.cell for record in tests if record.torch == torch}
    return VersionInfo(
        torch=torch,
        build=properties.get("torch.build", ""),
        git_version=properties.get("torch.git_version", ""),
        cuda_version=properties.get("torch.cuda_version", ""),
        device=properties.get("device", ""),
        gpu_count=(plan.environment.get("gpu_count") if plan else 0) or 0,
        planned_cells=planned,
        missing_cells=tuple(cell for cell in planned if cell not in reported),
        filters=plan.filters if plan else {},
        pool_starts=plan.pool_starts if plan else None,
    )


def _figure_value(value: object) -> float | str:
    """A recorded figure as a number when it is one (non-finite numbers included), else as text."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def _json_number(value: float | str) -> float | str:
    """JSON has no NaN or infinity: those are written as the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _version_key(version: str) -> tuple:
    """Release order for pins: 2.9.0 < 2.13.0; `system` and anything unparsable after them."""
    numbers = re.match(r"^(\d+(?:\.\d+)*)", version)
    if not numbers:
        return (1, (), version)
    return (0, tuple(int(n) for n in numbers.group(1).split(".")), version)


def _read_plan(path: Path) -> RunPlan:
    try:
        return read_plan(path)
    except PlanFileError as error:
        raise ResultsError(str(error)) from None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ResultsError(f"cannot read {path}: {error}") from None
