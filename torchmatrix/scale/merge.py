"""Merge report directories from shards, CI jobs and torch versions into one run directory.

The result reads like a single-machine run of the same matrix: every planned cell once. The
matrix file tells which cells were planned, so a shard whose job died or whose artifact never
arrived shows up as errored cells that say so, never as silence.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torchmatrix import file_writes, json_records
from torchmatrix.env.devices import Environment
from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.config import Matrix
from torchmatrix.matrix.plan import plan_runs
from torchmatrix.matrix.safe_names import UnsafeName, check_name
from torchmatrix.matrix.selection import SelectionError, Shard, shard_cells
from torchmatrix.messages.cross_version import CHECKPOINTS_DIR, READS_DIR
from torchmatrix.messages.run_plan import FILE_NAME as PLAN_FILE
from torchmatrix.messages.run_plan import PlanFileError, RunPlan, read_plan, write_plan
from torchmatrix.messages.run_tree import (
    ForeignEntry,
    refuse_foreign_entries,
    refuse_foreign_file,
    refuse_linked_folders,
)
from torchmatrix.reports import junit
from torchmatrix.run.outcomes import OutcomeBook
from torchmatrix.status import Status
from torchmatrix.user_error import UserError


class MergeError(UserError):
    """Inputs that cannot be merged into one honest report; the message says what to change."""


@dataclass
class VersionReport:
    """One `torch-<V>` directory found among the inputs."""

    path: Path
    plan: RunPlan

    @property
    def version(self) -> str:
        return self.plan.torch

    @property
    def shard(self) -> Shard | None:
        return self.plan.selection.shard


@dataclass
class MergeResult:
    """What the merge found, for the one-line summary the CLI prints."""

    cells: dict[str, int] = field(default_factory=dict)
    missing: dict[str, list[str]] = field(default_factory=dict)
    inputs: int = 0


def find_version_reports(inputs: Sequence[Path]) -> list[VersionReport]:
    """Every `torch-*/plan.json` below the inputs, not following symlinks (`latest` would double-count)."""
    found = []
    for root in inputs:
        if not root.is_dir():
            raise MergeError(f"{root} is not a directory; pass the report directories (downloaded artifacts) to merge")
        for directory, subdirectories, files in os.walk(root):
            subdirectories.sort()
            if Path(directory).name.startswith("torch-") and PLAN_FILE in files:
                path = Path(directory)
                try:
                    found.append(VersionReport(path, read_plan(path / PLAN_FILE)))
                except PlanFileError as error:
                    raise MergeError(str(error)) from None
    return found


@contextlib.contextmanager
def removed_unless_whole(out: Path) -> Iterator[None]:
    """Remove what the block added to `out` (and `out` itself with the parents it made) when the block
    raises, so a merge a full or read-only disk stopped leaves nothing a retry refuses as an earlier report."""
    made = next((path for path in reversed([out, *out.parents]) if not path.exists()), None)
    before = set(out.iterdir()) if made is None and out.is_dir() else set()
    try:
        yield
    except BaseException:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        elif out.is_dir():
            for path in set(out.iterdir()) - before:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        raise


def merge_reports(
    inputs: Sequence[Path],
    out: Path,
    matrix: Matrix,
    *,
    expected: Sequence[Cell],
    versions: Sequence[str] | None = None,
) -> MergeResult:
    """Write `out` as one run directory holding every expected cell of every expected version.

    `expected` is the selection the jobs were planned from (the matrix, after the user's
    filters); each job may have run any slice of it (shards, world sizes).
    """
    reports = find_version_reports(inputs)
    for report in reports:
        if report.plan.matrix_sha256 != matrix.digest:
            raise MergeError(
                f"{report.path} was produced from another matrix.toml than {matrix.path}; pass --config with the file the shards ran"
            )
    if any(out.glob("torch-*")):
        raise MergeError(f"{out} already holds a report; choose an empty --out directory")
    expected_versions = list(versions or [v for v in matrix.versions if v != "system"])
    expected_versions += sorted({r.version for r in reports} - set(expected_versions))
    result = MergeResult(inputs=len(reports))
    mine = {version: [r for r in reports if r.version == version] for version in expected_versions}
    for version in expected_versions:
        _refuse_mixed_builds(version, mine[version])
    # Every input is checked and read before anything is written: a refused merge leaves --out as it was.
    sources = {version: _cell_sources(version, mine[version]) for version in expected_versions}
    for report in reports:
        _refuse_foreign_cross_version(report.path)
    known_tests = {version: _tests_per_suite(sources[version].values()) for version in expected_versions}
    for version in expected_versions:
        cells_written, missing = _merge_version(
            version, mine[version], sources[version], known_tests[version], out / f"torch-{version}", matrix, expected
        )
        result.cells[version] = cells_written
        if missing:
            result.missing[version] = missing
    junit.merge_run(out, matrix.baseline)
    return result


def _refuse_mixed_builds(version: str, reports: list[VersionReport]) -> None:
    """Refuse shards of one version run on different torch builds or devices: the merged version
    names one build and device for all its cells, so a regression could not be told from a build change."""
    seen: dict[tuple[str, str, str], VersionReport] = {}
    for report in reports:
        environment = report.plan.environment
        if environment is None or environment.no_torch:
            continue  # a shard whose torch did not install ran no cell here
        seen.setdefault((environment.torch, environment.git_version, environment.description), report)
    if len(seen) > 1:
        (first, a), (second, b) = list(seen.items())[:2]
        raise MergeError(
            f"torch {version} was run on different builds or devices: {a.path} on {_build(first)}, {b.path} on {_build(second)}; "
            "merge each build's shards into its own --out (compare them with `compare`), or rerun the shards on one build"
        )


def _build(key: tuple[str, str, str]) -> str:
    torch, git_version, device = key
    return f"torch {torch} (git {git_version or 'unknown'}), {device}"


def _cell_sources(version: str, reports: list[VersionReport]) -> dict[str, Path]:
    """The cell report files of one version by cell id, each a plain file reported once."""
    sources: dict[str, Path] = {}
    for report in reports:
        for path in sorted(report.path.glob("*.xml")):
            try:
                check_name(path.stem, "cell report")
            except UnsafeName as error:
                raise MergeError(f"{path}: {error}") from None
            if path.is_symlink() or not path.is_file():
                raise MergeError(
                    f"{path} is a symlink, a directory or a pipe; a cell report must be a file of the report directory"
                )
            if path.stem in sources:
                raise MergeError(
                    f"cell {path.stem} of torch {version} is reported twice ({sources[path.stem]} and {path}); pass each shard's reports once"
                )
            sources[path.stem] = path
    return sources


def _merge_version(
    version: str,
    reports: list[VersionReport],
    sources: dict[str, Path],
    known_tests: dict[str, list[str]],
    out: Path,
    matrix: Matrix,
    expected: Sequence[Cell],
) -> tuple[int, list[str]]:
    out.mkdir(parents=True, exist_ok=True)
    for path in sources.values():
        file_writes.copy_file(path, out / path.name)
    for report in reports:
        _copy_cross_version(report.path, out)
    missing = [cell for cell in expected if cell.id not in sources]
    recorded = reports[0].plan.environment if reports else None
    environment = recorded or Environment.without_torch("unknown (no job of this version reported)")
    for cell in missing:
        book = OutcomeBook(plan_runs([cell], matrix.suites))
        for key, run in book.runs.items():
            if run.suite.name in known_tests:
                book.expect(key, known_tests[run.suite.name])
            book.fail_run(key, Status.ERROR, _missing_reason(version, cell, reports, matrix))
        junit.write_cell(out, version, environment, cell, book.for_cell(cell))
    write_plan(
        out,
        RunPlan(
            torch=version,
            matrix=str(matrix.path),
            matrix_sha256=matrix.digest,
            baseline=matrix.baseline,
            thresholds=dataclasses.asdict(matrix.report),
            merged_from=tuple(_merged_from(report) for report in reports),
            environment=environment,
            cells=tuple(sorted(set(sources) | {cell.id for cell in missing})),
            missing=tuple(cell.id for cell in missing),
            pool_starts=sum(r.plan.pool_starts for r in reports),
        ),
    )
    return len(sources) + len(missing), [cell.id for cell in missing]


def _merged_from(report: VersionReport) -> dict:
    """Where one input of a merged version came from: its directory and the cells its run selected."""
    selection = json_records.to_json(report.plan.selection)
    return {
        "path": str(report.path),
        "shard": selection["shard"],
        "only": selection["only"],
        "keyword": selection["keyword"],
    }


def _refuse_foreign_cross_version(version_dir: Path) -> None:
    """Refuse a shard whose checkpoints or reads hold a symlink or a pipe: copied, the link's target
    (a key, another run) would become part of the merged report."""
    try:
        if (version_dir / CHECKPOINTS_DIR).exists() or (version_dir / CHECKPOINTS_DIR).is_symlink():
            refuse_foreign_entries(version_dir / CHECKPOINTS_DIR)
        refuse_linked_folders(version_dir, [version_dir / READS_DIR])
        for path in sorted((version_dir / READS_DIR).glob("*.xml")):
            refuse_foreign_file(path)
    except ForeignEntry as error:
        raise MergeError(str(error)) from None


def _copy_cross_version(version_dir: Path, out: Path) -> None:
    """Carry what the cross_version suite wrote (checkpoints) and read (reads/*.xml) into the merged
    version, so its report has both directions and a later `cross-read` of the merge finds the writes."""
    for directory, _, files in os.walk(version_dir / CHECKPOINTS_DIR):
        target = out / CHECKPOINTS_DIR / Path(directory).relative_to(version_dir / CHECKPOINTS_DIR)
        target.mkdir(parents=True, exist_ok=True)
        for name in sorted(files):  # each a regular file: _refuse_foreign_cross_version checked the tree
            file_writes.copy_file(Path(directory) / name, target / name)
    for path in sorted((version_dir / READS_DIR).glob("*.xml")):
        (out / READS_DIR).mkdir(exist_ok=True)
        file_writes.copy_file(path, out / READS_DIR / path.name)


def _tests_per_suite(paths) -> dict[str, list[str]]:
    """Test names per suite as other cells reported them, so a missing cell lists the same tests."""
    names: dict[str, list[str]] = {}
    for path in sorted(paths, key=lambda path: path.name):
        for suite in junit.read_suites(path):
            for case in suite:
                tests = names.setdefault(case.classname, [])
                test = junit.test_of_testcase(case.name)
                if test not in tests:
                    tests.append(test)
    return names


def _missing_reason(version: str, cell: Cell, reports: list[VersionReport], matrix: Matrix) -> str:
    """Name the shard that should have covered the cell, when the other shards' plans tell."""
    generic = f"no report for this cell from torch {version}: its job failed before writing reports, or its artifact is missing"
    for report in reports:
        if not report.shard:
            continue
        try:
            selection = matrix.select(report.plan.selection.sharded(None))
        except SelectionError as error:
            raise MergeError(
                f"{report.path / PLAN_FILE}: its filters do not apply to {matrix.path.name} ({error})"
            ) from None
        if cell not in selection:
            continue
        count = report.shard.count
        index = next(i for i in range(1, count + 1) if cell in shard_cells(selection, Shard(i, count)))
        return f"no report for this cell: shard {index}/{count} of torch {version} delivered none (its job failed before writing reports, or its artifact is missing)"
    return generic
