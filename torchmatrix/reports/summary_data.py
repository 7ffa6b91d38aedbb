"""What summary.md and summary.html both say about a run, computed once for both to render.

The header (run, start, hosts, filters, versions), the totals per torch version and the counts in
the section titles are the same facts in both pages; only their markup differs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from torchmatrix.messages.properties import COMPILE_SECONDS, COMPILE_SECONDS_SAVED
from torchmatrix.reports.checkpoint_directions import Direction, direction_name
from torchmatrix.reports.confirmation_notes import why_not_rerun
from torchmatrix.reports.records import RootCause, RunResults, SkipReason, TestRecord
from torchmatrix.status import Confirmation, Status, count

SHA_CHARS = 12
LIMITS_NOTE = (
    "These failed only because ranks are simulated as CPU processes on gloo: each names the known limit "
    "and what works around it (docs: The CPU simulation and its limits). They are neither failures of "
    "the stack nor passes, are not re-run alone, and do not fail the run; on GPUs the same text is a failure."
)

DIRECTIONS_NOTE = (
    "A rollback W→R or forward W→R column has one mark per cell: whether torch R loaded exactly the "
    "checkpoint torch W wrote; a break there is the candidate's (its writer for a rollback, its reader "
    "for a forward), whichever version ran the read."
)


@dataclass(frozen=True)
class Confirmations:
    """What re-running the failed and errored tests alone showed, per testcase as the totals count them."""

    fails_alone: int = 0
    passed_alone: int = 0
    skipped_alone: int = 0
    not_rerun: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, records: Iterable[TestRecord]) -> Confirmations:
        seen: Counter[Confirmation | None] = Counter()
        why: Counter[str] = Counter()
        for record in records:
            if record.status.is_failing:
                seen[record.confirmation] += 1
                if record.confirmation not in _VERDICTS:
                    why[why_not_rerun(record.confirmation, record.confirmation_note)] += 1
        return cls(
            seen[Confirmation.FAILS_ALONE],
            seen[Confirmation.PASSED_ALONE],
            seen[Confirmation.SKIPPED_ALONE],
            dict(why.most_common()),
        )

    @property
    def rerun(self) -> int:
        return self.fails_alone + self.passed_alone + self.skipped_alone

    @property
    def failing(self) -> int:
        return self.rerun + sum(self.not_rerun.values())

    @property
    def unconfirmed(self) -> int:
        """Failures with no verdict either way: skipped alone, or not re-run."""
        return self.failing - self.fails_alone - self.passed_alone

    @property
    def columns(self) -> list[tuple[str, int]]:
        """The counts both totals tables show after the statuses: of the failed and errored tests,
        how many fail alone (real), passed alone (order-dependent) and are unconfirmed."""
        return [
            ("fail alone", self.fails_alone),
            ("passed alone", self.passed_alone),
            ("unconfirmed", self.unconfirmed),
        ]

    @property
    def note(self) -> str:
        """How many failures were re-run alone and what that showed, and how many were not and why:
        the sentence that opens both pages' failure sections."""
        if not self.failing:
            return ""
        verdicts = [
            f"{self.fails_alone} {'fails' if self.fails_alone == 1 else 'fail'} alone (a behaviour of that torch)",
            f"{self.passed_alone} passed alone (order-dependent or flaky)",
        ]
        if self.skipped_alone:
            verdicts.append(f"{self.skipped_alone} skipped alone (depends on an earlier test)")
        reasons = "; ".join(why if len(self.not_rerun) == 1 else f"{n}: {why}" for why, n in self.not_rerun.items())
        if not self.rerun:
            return f"No failing test was re-run alone ({reasons}): none is confirmed, and any may be order-dependent or flaky."
        if not self.not_rerun:
            return f"Every failing test was re-run alone in a fresh process: {', '.join(verdicts)}."
        return (
            f"{self.rerun} of {count(self.failing, 'failing test')} were re-run alone in a fresh process: "
            f"{', '.join(verdicts)}; {count(self.failing - self.rerun, 'was', 'were')} not re-run ({reasons}) "
            "and count as unconfirmed."
        )


_VERDICTS = {Confirmation.FAILS_ALONE, Confirmation.PASSED_ALONE, Confirmation.SKIPPED_ALONE}


@dataclass(frozen=True)
class VersionRow:
    """One torch version of the run as its totals row shows it."""

    torch: str
    build: str
    device: str
    cells: int
    missing: int
    counts: dict[Status, int]
    confirmations: Confirmations
    filters: str
    test_seconds: float = 0.0
    compile_seconds: float = 0.0
    compile_seconds_saved: float = 0.0
    git: str = ""  # torch.version.git_version: a nightly's or rc's version names no commit, this does


@dataclass(frozen=True)
class Summary:
    """The header, totals, root causes and skip reasons of a run; section titles worded once."""

    run_id: str
    started: str
    hosts: str
    baseline: str
    matrix_path: str
    matrix_sha256: str
    versions: list[VersionRow]
    directions: list[VersionRow]
    cells: int
    totals: dict[Status, int]
    confirmations: Confirmations
    root_causes: list[RootCause]
    simulation_limits: list[RootCause]
    skip_reasons: list[SkipReason]

    @property
    def filtered(self) -> list[VersionRow]:
        """The versions whose run was filtered, so the page says it is not the whole matrix."""
        return [version for version in self.versions if version.filters]

    @property
    def compiled(self) -> list[VersionRow]:
        """The versions whose tests spent time in torch.compile."""
        return [version for version in self.versions if version.compile_seconds]

    @property
    def compile_note(self) -> str:
        """What the compile times are, after each version's (`torch 2.13.0: 41 s of 310 s of tests`)."""
        return (
            f"the `{COMPILE_SECONDS}` figure summed over the tests that compiled: each test's slowest rank's "
            "seconds in torch.compile as Dynamo times them, a part of the test's duration; what the compile cache "
            f"saved is the `{COMPILE_SECONDS_SAVED}` figure of the tests of cells that compile with Inductor or "
            "aot_eager (whose graphs and kernels the store keeps): what they compiled the first time their cell's "
            "cache folder saw them, less what they compiled now"
        )

    @property
    def grid_title(self) -> str:
        return f"Grid: {count(self.cells, 'cell')} × {count(len(self.versions), 'torch version')}"

    @property
    def failures_title(self) -> str:
        """`Failures: 11 failed and 2 errored tests in 3 groups by root cause`: the totals' own numbers."""
        failed, errored = self.totals[Status.FAILED], self.totals[Status.ERROR]
        if failed and errored:
            tests = f"{failed} failed and {errored} errored tests"
        else:
            tests = count(failed, "failed test") if failed else count(errored, "errored test")
        return f"Failures: {tests} in {count(len(self.root_causes), 'group')} by root cause"

    @property
    def limits_title(self) -> str:
        """`CPU-simulation limits: 2 tests in 1 group`."""
        tests = count(self.totals[Status.SIMULATION_LIMIT], "test")
        return f"{Status.SIMULATION_LIMIT.column}: {tests} in {count(len(self.simulation_limits), 'group')}"

    @property
    def skipped_title(self) -> str:
        reasons = len(self.skip_reasons)
        return f"Skipped: {count(self.totals[Status.SKIPPED], 'test')} for {count(reasons, 'reason')}"


def summarize(results: RunResults) -> Summary:
    """The facts both summary pages render, from a run read back."""
    return Summary(
        run_id=results.run_id,
        started=results.created,
        hosts=", ".join(results.hosts),
        baseline=results.baseline,
        matrix_path=results.matrix_path,
        matrix_sha256=results.matrix_sha256[:SHA_CHARS],
        versions=[
            VersionRow(
                torch=v.torch,
                build=v.environment.torch,
                git=v.environment.git_version,
                device=v.environment.description,
                cells=len({record.cell for record in results.own_records(v.torch)}),
                missing=len(v.missing_cells),
                counts=status_counts(results.own_records(v.torch)),
                confirmations=Confirmations.of(results.own_records(v.torch)),
                filters=describe_filters(v.filters),
                test_seconds=sum(record.duration for record in results.own_records(v.torch)),
                compile_seconds=sum(record.figures.get(COMPILE_SECONDS, 0) for record in results.own_records(v.torch)),
                compile_seconds_saved=sum(
                    record.figures.get(COMPILE_SECONDS_SAVED, 0) for record in results.own_records(v.torch)
                ),
            )
            for v in results.versions
        ],
        directions=_direction_rows(results),
        cells=len(results.cells),
        totals=results.totals(),
        confirmations=Confirmations.of(results.tests),
        root_causes=results.root_causes(),
        simulation_limits=results.simulation_limits(),
        skip_reasons=results.skip_reasons(),
    )


def status_counts(records: Iterable[TestRecord]) -> dict[Status, int]:
    """Testcases per status, worst first."""
    counts = dict.fromkeys(Status.worst_first(), 0)
    for record in records:
        counts[record.status] += 1
    return counts


def _direction_rows(results: RunResults) -> list[VersionRow]:
    """One totals row per checkpoint direction of the run (`rollback 2.15.0→2.13.0`): its reads,
    which the pair owns, counted apart from either version's own tests."""
    reads: dict[tuple[str, str], list[TestRecord]] = {}
    for record in results.tests:
        if record.reads_writer is not None:
            reads.setdefault((record.reads_writer, record.torch), []).append(record)
    rows = []
    for (_, reader), records in reads.items():
        version = next((v for v in results.versions if v.torch == reader), None)
        rows.append(
            VersionRow(
                torch=read_label(records[0], results.baseline),
                build=version.environment.torch if version else "",
                device=version.environment.description if version else "",
                cells=len({record.cell for record in records}),
                missing=0,
                counts=status_counts(records),
                confirmations=Confirmations.of(records),
                filters="",
                test_seconds=sum(record.duration for record in records),
            )
        )
    return rows


def read_label(record: TestRecord, baseline: str) -> str:
    """`rollback 2.15.0→2.13.0` for a read of another version's checkpoint (the pair owns it), else ""."""
    writer = record.reads_writer
    return f"{direction_name(record.torch, baseline)} {writer}→{record.torch}" if writer is not None else ""


def reached_by(cause: RootCause, baseline: str) -> list[TestRecord]:
    """The first failure per torch version the cause reached (per direction, for a read of another
    version's checkpoint), in the order first seen: whom both pages name after a cause's counts."""
    firsts: dict[str, TestRecord] = {}
    for record, _ in cause.failures:
        firsts.setdefault(read_label(record, baseline) or f"torch {record.torch}", record)
    return list(firsts.values())


def direction_rows(directions: list[Direction]) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """Per checkpoint direction, a row per root cause it failed on and per reason it was not checked, with the cells."""
    return [
        (d.name, result, why, cells)
        for d in directions
        for result, groups in (("failed", d.failed), ("not checked", d.not_checked))
        for why, cells in groups.items()
    ]


def describe_filters(filters: dict) -> str:
    """A version's filters as the command line spelled them: `--only fsdp=fsdp1,fsdp2 -k 'ws2' --shard 1/4`."""
    parts = [f"--only {axis}={','.join(map(str, values))}" for axis, values in filters.get("only", {}).items()]
    if filters.get("keyword"):
        parts.append(f"-k '{filters['keyword']}'")
    if filters.get("shard"):
        parts.append(f"--shard {filters['shard']}")
    return " ".join(parts)


def distinct_texts(cause: RootCause) -> list[list[TestRecord]]:
    """The cause's failures grouped by identical full text, each group in the order first seen."""
    groups: dict[str, list[TestRecord]] = {}
    for record, _ in cause.failures:
        groups.setdefault(record.text or record.message, []).append(record)
    return list(groups.values())


def other_cells(run_cell: str, cells: Iterable[str]) -> list[str]:
    """The cells a result that `run_cell` ran also stands for, as both pages name them."""
    return [cell for cell in cells if cell != run_cell]
