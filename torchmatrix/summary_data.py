"""What summary.md and summary.html both say about a run, computed once for both to render.

The header (run, start, hosts, filters, versions), the totals per torch version and the counts in
the section titles are the same facts in both pages; only their markup differs.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchmatrix.results import RootCause, RunResults, SkipReason, TestRecord
from torchmatrix.status import Status

SHA_CHARS = 12


@dataclass(frozen=True)
class VersionRow:
    """One torch version of the run as its totals row shows it."""

    torch: str
    build: str
    device: str
    cells: int
    missing: int
    counts: dict[Status, int]
    filters: str


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
    cells: int
    totals: dict[Status, int]
    root_causes: list[RootCause]
    skip_reasons: list[SkipReason]

    @property
    def filtered(self) -> list[VersionRow]:
        """The versions whose run was filtered, so the page says it is not the whole matrix."""
        return [version for version in self.versions if version.filters]

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
                build=v.build,
                device=v.device,
                cells=len({record.cell for record in results.records(v.torch)}),
                missing=len(v.missing_cells),
                counts=results.totals(v.torch),
                filters=describe_filters(v.filters),
            )
            for v in results.versions
        ],
        cells=len(results.cells),
        totals=results.totals(),
        root_causes=results.root_causes(),
        skip_reasons=results.skip_reasons(),
    )


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


def count(n: int, singular: str, plural: str | None = None) -> str:
    """`1 cell`, `3 cells`, `2 fixes`: a number with its noun, as both pages word them."""
    return f"{n} {singular if n == 1 else plural or singular + 's'}"
