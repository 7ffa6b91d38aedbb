"""A run directory read back into RunResults: the self-describing per-cell JUnit files (or the
merged junit.xml when only that was kept) plus each version's plan.json, so a run directory
copied out of CI reads the same as one on the machine that made it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from junitparser import TestSuite

from torchmatrix.env.devices import Environment
from torchmatrix.matrix.sections import REPORT_KEYS, ReportSettings
from torchmatrix.messages.properties import WARNING_PROPERTY, confirmation_note_property, confirmation_property
from torchmatrix.messages.run_plan import PlanFileError, RunPlan, read_plan
from torchmatrix.reports import confirmation_notes, junit
from torchmatrix.reports.machine_paths import relative_path
from torchmatrix.reports.records import ResultsError, RunResults, TestRecord, VersionInfo, figure_value
from torchmatrix.reports.results_json import FILE_NAME, read_json
from torchmatrix.status import Confirmation, Status

WARNING_PREFIX = f"{WARNING_PROPERTY}."  # the plugin's per-test warning properties: warning.1, warning.2, ...


def recorded_report_settings(run_dir: Path) -> tuple[str, ReportSettings] | None:
    """The baseline and `[report]` ratios the run's plan.json files record (the first version's), or None for
    a run from before they were recorded: the matrix path a plan names is never read (it may point anywhere)."""
    for plan in sorted(run_dir.glob("torch-*/plan.json")):
        recorded = _read_plan(plan)
        if recorded.baseline:
            known = {
                key: value is True if key == "prerelease_blocks" else float(value)
                for key, value in recorded.thresholds.items()
                if key in REPORT_KEYS
            }
            return recorded.baseline, ReportSettings(**known)
    return None


def load_results(path: Path, baseline: str | None = None, settings: ReportSettings | None = None) -> RunResults:
    """Read a run directory, or a results.json (a CI artifact), into RunResults."""
    if path.is_file():
        return read_json(path)
    if not path.is_dir():
        raise ResultsError(f"{path} does not exist; pass a run directory (reports/<run-id>) or its results.json")
    suites = _suites(path)
    if not suites and not any(path.glob("torch-*/plan.json")):
        if (path / FILE_NAME).is_file():
            return read_json(path / FILE_NAME)
        raise ResultsError(f"{path} holds no JUnit reports; pass a run directory made by `python -m torchmatrix run`")
    return _from_suites(path.resolve(), suites, baseline, settings or ReportSettings())


def _suites(run_dir: Path) -> list[TestSuite]:
    files = junit.cell_report_files(run_dir)
    if not files and (run_dir / junit.MERGED_NAME).is_file():
        files = [run_dir / junit.MERGED_NAME]
    return [suite for path in files for suite in junit.read_suites(path)]


def _from_suites(run_dir: Path, suites: list[TestSuite], baseline: str | None, settings: ReportSettings) -> RunResults:
    plans = {plan.parent.name.removeprefix("torch-"): _read_plan(plan) for plan in run_dir.glob("torch-*/plan.json")}
    cells: dict[str, dict[str, str]] = {}
    tests: list[TestRecord] = []
    recorded: dict[str, Environment] = {}
    for suite in suites:
        properties = {p.name: p.value for p in suite.properties()}
        torch = properties.get("torch", "")
        cell = properties.get("cell", "")
        recorded.setdefault(torch, _environment_of(properties))
        cells.setdefault(cell, {k.removeprefix("axis."): v for k, v in properties.items() if k.startswith("axis.")})
        tests.extend(_records(suite, torch, cell, properties))
    for version, plan in plans.items():
        if plan.environment is not None:  # the probe's whole record, where the JUnit words hold less
            recorded[version] = plan.environment
        recorded.setdefault(version, Environment())
    versions = sorted(recorded, key=_version_key)
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
        matrix_path=relative_path(next((p.matrix or "" for p in plans.values()), ""), run_dir),
        matrix_sha256=plan_sha[0] if plan_sha else "",
        baseline=baseline if baseline in versions or not versions else versions[0],
        settings=settings,
        versions=[_version_info(v, recorded[v], plans.get(v), tests) for v in versions],
        cells=cells,
        tests=tests,
    )


def run_started(plans, suites: list[TestSuite]) -> str:
    """When the run started: the earliest start its versions' plan.json files record, else the
    earliest cell's JUnit timestamp (a run directory holding only junit.xml)."""
    recorded = [plan.started for plan in plans if plan.started]
    return min(recorded or [s.timestamp for s in suites if s.timestamp], default="")


def _environment_of(properties: dict[str, str]) -> Environment:
    """A version's environment as its cells' JUnit properties name it."""
    return Environment.recorded(*(properties.get(name, "") for name in junit.ENVIRONMENT_PROPERTIES))


def _records(suite: TestSuite, torch: str, cell: str, properties: dict[str, str]) -> list[TestRecord]:
    records = []
    for case in suite:
        test = case.name.removesuffix(junit.testcase_name("", torch, cell))
        prefix = f"{case.classname}::{test}::"
        result = case.result[0] if case.result else None
        confirmation = _confirmation(properties.get(confirmation_property(case.classname, test)))
        text = (result.text or "") if result is not None else ""
        note = properties.get(confirmation_note_property(case.classname, test))
        if note is None:  # a report written before the note had a property of its own
            text, note = confirmation_notes.split_old_text(text, confirmation)
        records.append(
            TestRecord(
                torch=torch,
                cell=cell,
                suite=case.classname,
                test=test,
                status=_status(case),
                duration=round(case.time or 0.0, 3),
                message=(result.message or "") if result is not None else "",
                text=text,
                ran_in=properties.get(f"{case.classname}.ran_in"),
                confirmation=confirmation,
                confirmation_note=note,
                figures={
                    name.removeprefix(prefix): figure_value(value)
                    for name, value in properties.items()
                    if name.startswith(prefix) and not name.startswith(prefix + WARNING_PREFIX)
                },
                warnings=tuple(
                    _warning(value) for name, value in properties.items() if name.startswith(prefix + WARNING_PREFIX)
                ),
            )
        )
    return records


def _confirmation(value: str | None) -> Confirmation | None:
    """A testcase's confirmation property as its verdict; a word this torchmatrix does not write
    (another version's) reads as none recorded, as an absent property does."""
    try:
        return Confirmation.parse(value, "confirmation")
    except ValueError:
        return None


def _warning(value: str) -> dict:
    """A `<suite>::<test>::warning.N` property back into its entry; text that is not one stays its message."""
    try:
        entry = json.loads(value)
    except ValueError:
        entry = None
    if not isinstance(entry, dict):
        return {"category": "", "module": "", "message": value, "count": 1}
    return entry


def _status(case) -> Status:
    if case.is_error:
        return Status.ERROR
    if case.is_failure:
        return Status.FAILED
    if case.is_skipped:
        return Status.SIMULATION_LIMIT if case.result[0].type == Status.SIMULATION_LIMIT else Status.SKIPPED
    return Status.PASSED


def _version_info(torch: str, environment: Environment, plan: RunPlan | None, tests: list[TestRecord]) -> VersionInfo:
    """The version's environment as recorded; what was planned (and never reported) from plan.json."""
    planned = plan.cells if plan else ()
    reported = {record.cell for record in tests if record.torch == torch}
    return VersionInfo(
        torch=torch,
        environment=environment,
        planned_cells=planned,
        missing_cells=tuple(cell for cell in planned if cell not in reported),
        filters=plan.filters if plan else {},
        pool_starts=plan.pool_starts if plan else None,
        load_average=plan.load_average if plan else {},
    )


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
