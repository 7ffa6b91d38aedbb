"""JUnit XML: one file per (torch version, cell), and the merged file CI tools read.

Each cell's file is self-describing (torch build, device and axis values as properties), so
merging is mostly concatenation: a version's reads of another version's cross_version checkpoints
belong to the pair, so the merged file holds them as a testsuite per direction and cell
(`rollback/2.15.0→2.13.0/<cell-id>`), never as a second `torch-V/<cell-id>`. Testcase names carry
the torch version and cell id, because several CI reporters keep only the first of two same-named
cases. junitparser writes the XML.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

from torchmatrix import file_writes
from torchmatrix.env.devices import Environment
from torchmatrix.matrix.cells import Cell, filter_token
from torchmatrix.matrix.plan import SuiteRun
from torchmatrix.messages.cross_version import READ_TEST, READS_DIR
from torchmatrix.messages.events import TestOutcome
from torchmatrix.messages.output_cap import HARD_LIMIT_BYTES, cap_text
from torchmatrix.messages.properties import confirmation_note_property, confirmation_property
from torchmatrix.reports.checkpoint_directions import ROLLBACK, direction_name
from torchmatrix.reports.machine_paths import without_machine_paths
from torchmatrix.reports.records import ResultsError
from torchmatrix.reports.untrusted_text import one_line, visible
from torchmatrix.status import Status

NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# A CPU-simulation limit is a <skipped> whose type says so: schema-valid, and no CI tool counts it a failure.
RESULT_TYPES = {Status.FAILED: Failure, Status.ERROR: Error, Status.SKIPPED: Skipped, Status.SIMULATION_LIMIT: Skipped}
MERGED_NAME = "junit.xml"


def xml_text(value: object) -> str:
    """Test-provided text as a report may show it: control and bidi characters, and any other
    character XML 1.0 forbids (NUL, lone surrogates), written as escapes; no longer than a parser takes."""
    escaped = NOT_XML.sub(lambda m: f"\\u{ord(m.group()):04x}", visible(value))
    return cap_text(escaped, HARD_LIMIT_BYTES)


def testcase_name(test: str, version: str, cell_id: str) -> str:
    return f"{test}[torch={version},{cell_id}]"


def test_of_testcase(name: str) -> str:
    """The test's own name back from a testcase name."""
    return name.rsplit("[torch=", 1)[0]


def suite_name(version: str, cell_id: str) -> str:
    return f"torch-{version}/{cell_id}"


ENVIRONMENT_PROPERTIES = ("torch.build", "torch.git_version", "torch.cuda_version", "device")
"""A cell's properties that name its environment, in `Environment.recorded`'s order."""


def cell_report(
    version: str,
    environment: Environment,
    cell: Cell,
    outcomes: Sequence[tuple[SuiteRun, TestOutcome]],
    started: float | None = None,
) -> TestSuite:
    """The <testsuite> of one cell: its tests (including those a representative cell ran) and properties;
    its timestamp is when the cell's first test started (epoch seconds), or now for a cell that never ran."""
    suite = TestSuite(xml_text(suite_name(version, cell.id)))
    suite.add_property("torch", xml_text(version))
    build, git, cuda, device = ENVIRONMENT_PROPERTIES
    for name, value in ((build, environment.torch), (git, environment.git_version), (cuda, environment.cuda_version)):
        if value:
            suite.add_property(name, xml_text(value))
    suite.add_property(device, xml_text(environment.description))
    suite.add_property("cell", xml_text(cell.id))
    for axis, value in cell.items():
        suite.add_property(f"axis.{axis}", xml_text(filter_token(value)))
    ran_in = {}
    for run, outcome in outcomes:
        if run.cell != cell:
            ran_in[run.suite.name] = run.cell.id
        suite.add_testcase(_testcase(run.suite.name, version, cell.id, outcome))
        for name, value in outcome.properties:
            suite.add_property(xml_text(f"{run.suite.name}::{outcome.test}::{name}"), xml_text(value))
        if outcome.confirmation is not None:
            suite.add_property(
                xml_text(confirmation_property(run.suite.name, outcome.test)), outcome.confirmation.value
            )
            note = confirmation_note_property(run.suite.name, outcome.test)
            suite.add_property(xml_text(note), xml_text(outcome.confirmation_note))
    for name, representative in ran_in.items():
        suite.add_property(f"{name}.ran_in", xml_text(representative))
    suite.hostname = xml_text(socket.gethostname())
    when = datetime.fromtimestamp(started, timezone.utc) if started is not None else datetime.now(timezone.utc)
    suite.timestamp = when.isoformat(timespec="seconds")
    suite.update_statistics()
    return suite


def _testcase(suite: str, version: str, cell_id: str, outcome: TestOutcome) -> TestCase:
    case = TestCase(
        xml_text(testcase_name(outcome.test, version, cell_id)),
        classname=xml_text(suite),
        time=round(outcome.duration, 3),
    )
    result_type = RESULT_TYPES.get(outcome.status)
    if result_type is not None:
        result = result_type(
            xml_text(outcome.message), None if outcome.status is Status.SKIPPED else outcome.status.value
        )
        if outcome.text:
            result.text = xml_text(outcome.text)
        case.result = [result]
    if outcome.stdout:
        case.system_out = xml_text(outcome.stdout)
    if outcome.stderr:
        case.system_err = xml_text(outcome.stderr)
    return case


def write_suites(path: Path, suites: Sequence[TestSuite]) -> None:
    """Write <testsuites> atomically, with totals but no `skipped` attribute (junit-10.xsd has none)."""
    xml = JUnitXml("torchmatrix")
    for suite in suites:
        suite.update_statistics()
        xml.add_testsuite(suite)
    xml.tests = sum(s.tests for s in suites)
    xml.failures = sum(s.failures for s in suites)
    xml.errors = sum(s.errors for s in suites)
    xml.time = round(sum(s.time for s in suites), 3)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_writes.replacing(path) as partial:  # a full disk, or Ctrl-C: the file it replaces stays whole
        xml.write(str(partial), pretty=True)


def write_cell(
    version_dir: Path,
    version: str,
    environment: Environment,
    cell: Cell,
    outcomes,
    started: float | None = None,
    project: Path | None = None,
) -> Path:
    """Write `<version_dir>/<cell-id>.xml`, the one-cell file every merge starts from; its messages,
    tracebacks and output name paths relative to the run directory or `project`, never this machine's."""
    path = version_dir / f"{cell.id}.xml"
    run_dir = version_dir.parent.parent if version_dir.name == READS_DIR else version_dir.parent
    upstream = [(run, _without_machine_paths(outcome, run_dir, project)) for run, outcome in outcomes]
    write_suites(path, [cell_report(version, environment, cell, upstream, started)])
    return path


def _without_machine_paths(outcome: TestOutcome, run_dir: Path, project: Path | None) -> TestOutcome:
    texts = ("message", "text", "stdout", "stderr", "confirmation_note")
    return replace(outcome, **{name: without_machine_paths(getattr(outcome, name), run_dir, project) for name in texts})


def read_suites(path: Path) -> list[TestSuite]:
    """The <testsuite>s of a JUnit file; one that is not a regular file or not readable JUnit XML
    (truncated, an entity bomb) is a ResultsError naming it."""
    if not path.is_file():
        raise ResultsError(
            f"{path} is not a regular file (a directory or a pipe?); a cell report must be a file: remove it"
        )
    try:
        return list(JUnitXml.fromfile(str(path)))
    except (SyntaxError, OSError, ValueError) as error:  # lxml's XMLSyntaxError is a SyntaxError
        raise ResultsError(
            f"{path} is not readable JUnit XML ({one_line(str(error), 200)}); rerun that cell or delete the file"
        ) from None


def cell_report_files(run_dir: Path) -> list[Path]:
    """Per-cell files of every torch version in a run directory (its reads of the other versions'
    checkpoints included), in a stable order."""
    return sorted([*run_dir.glob("torch-*/*.xml"), *run_dir.glob("torch-*/reads/*.xml")])


def merge_run(run_dir: Path, baseline: str) -> Path:
    """Merge the per-cell files of a run directory into <run_dir>/junit.xml, each version's reads
    of the other versions' checkpoints as rollback and forward testsuites (`baseline` says which)."""
    suites = []
    for path in cell_report_files(run_dir):
        for suite in read_suites(path):
            suites += direction_suites(suite, baseline) if path.parent.name == READS_DIR else [suite]
    merged = run_dir / MERGED_NAME
    write_suites(merged, suites)
    return merged


def direction_suites(suite: TestSuite, baseline: str) -> list[TestSuite]:
    """A read pass's cell testsuite split into one testsuite per checkpoint direction, named
    `rollback/<writer>→<reader>/<cell-id>`, with the direction, writer, reader and the version the
    result is attributed to (the candidate) as properties; a case that names no writer stays in
    `torch-<reader>/reads/<cell-id>`."""
    properties = [(p.name, p.value) for p in suite.properties()]
    reader, cell = dict(properties).get("torch", ""), dict(properties).get("cell", "")
    prefix = f"{READ_TEST}[writer="
    split: dict[str, list[TestCase]] = {}
    for case in suite:
        test = test_of_testcase(case.name)
        writer = test[len(prefix) : -1] if test.startswith(prefix) and test.endswith("]") else ""
        split.setdefault(writer, []).append(case)
    suites = []
    for writer, cases in split.items():
        direction = direction_name(reader, baseline)
        name = f"{direction}/{writer}→{reader}/{cell}" if writer else f"{suite_name(reader, cell)}/{READS_DIR}"
        part = TestSuite(xml_text(name))
        for key, value in properties:
            part.add_property(key, value)
        if writer:
            part.add_property("checkpoint.direction", direction)
            part.add_property("checkpoint.writer", xml_text(writer))
            part.add_property("checkpoint.reader", xml_text(reader))
            part.add_property("checkpoint.attributed_to", xml_text(writer if direction == ROLLBACK else reader))
        for case in cases:
            part.add_testcase(case)
        part.hostname, part.timestamp = suite.hostname, suite.timestamp
        suites.append(part)
    return suites


def has_problems(path: Path) -> bool:
    """Whether a JUnit file holds any failure or error."""
    return any(suite.failures or suite.errors for suite in read_suites(path))
