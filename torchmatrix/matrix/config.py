"""Load and validate matrix.toml into a `Matrix`.

Every problem a user can make in the file is reported as one `ConfigError` line that names the
file, the key path and what to change, so the CLI can print it and exit 2 without a traceback.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import stat
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torchmatrix.components.optional import DEVICE_TYPES, OptionalWhere
from torchmatrix.components.pipeline_axis import PIPELINE_AXIS, pipeline_problem
from torchmatrix.matrix.cells import (
    MAX_CELLS,
    MAX_SCANNED,
    Cell,
    cell_bound,
    expand_cells,
    filter_token,
    iter_cells,
)
from torchmatrix.matrix.channels import CHANNEL_KEYS, Channels, channel_of, parse_channels
from torchmatrix.matrix.known_failures import KEYS as KNOWN_FAILURE_KEYS
from torchmatrix.matrix.known_failures import KnownFailure
from torchmatrix.matrix.meshes import MESH_AXIS, MESH_KINDS, TWO_D_FSDP, TWO_D_MESH_KINDS, mesh_layout, mesh_problem
from torchmatrix.matrix.sections import (
    INSTALL_KEYS,
    NAME,
    OPTIONAL_KEYS,
    PROJECT_KEYS,
    REPORT_KEYS,
    TORCH_KEYS,
    VALUE,
    ConfigError,
    ReportSettings,
    TorchInstall,
    Where,
    read_axes,
    read_components,
    read_exclude,
    read_include,
    read_known_failures,
    read_optional,
    read_project_root,
    read_report,
    read_requires,
    read_torch,
)
from torchmatrix.matrix.selection import (
    EVERY_CELL,
    CellSelection,
    KeywordExpression,
    SelectionError,
    passes_only,
    select_cells,
    shard_cells,
)
from torchmatrix.matrix.suite_options import ResumeOptions
from torchmatrix.matrix.suite_tables import MAX_TEST_TIMEOUT_S, SUITE_KEYS, Suite, read_suites

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

TOP_LEVEL_KEYS = (
    "torch",
    "axes",
    "exclude",
    "include",
    "known_failure",
    "suites",
    "components",
    "requires",
    "optional",
    "report",
    "project",
)


@dataclass(frozen=True)
class Matrix:
    """The validated contents of one matrix.toml."""

    path: Path
    versions: tuple[str, ...]
    baseline: str
    axes: dict[str, tuple[Any, ...]]
    exclude: tuple[dict[str, Any], ...]
    include: tuple[dict[str, Any], ...]
    suites: dict[str, Suite]
    components: dict[str, str]
    report: ReportSettings
    digest: str
    installs: dict[str, TorchInstall] = field(default_factory=dict)
    requires: dict[str, tuple[str, ...]] = field(default_factory=dict)
    optional: dict[str, OptionalWhere] = field(default_factory=dict)
    known_failures: tuple[KnownFailure, ...] = ()
    channels: Channels = field(default_factory=Channels)

    def install(self, version: str) -> TorchInstall:
        """`[torch.install."V"]` (a dated nightly's defaults to "nightly"'s), else pip's defaults; a
        channel value installs from its channel's index unless its table names another."""
        install = self.installs.get(version) or self.installs.get(channel_of(version) or "", TorchInstall())
        url = self.channels.url(version)
        return replace(install, index_url=install.index_url or url) if url else install

    @property
    def root(self) -> Path:
        """The directory suite paths and component imports are resolved from."""
        return self.path.parent

    def cells(self) -> list[Cell]:
        """Every cell of the matrix, in expansion order; ConfigError when there could be more than
        MAX_CELLS (refused before expansion)."""
        return list(self._expanded)

    def select(self, selection: CellSelection = EVERY_CELL) -> list[Cell]:
        """The cells `selection` keeps. Past MAX_CELLS, `--only` or `-k` must narrow the matrix:
        `--only` prunes the axes before anything expands, `-k` reads the rest one cell at a time
        (at most MAX_SCANNED), and at most MAX_CELLS cells are held."""
        only, keyword, shard = selection.only, selection.keyword, selection.shard
        if cell_bound(self.axes, self.include) <= MAX_CELLS or not selection.narrows:
            return select_cells(self.cells(), only=only, keyword=keyword, shard=shard)
        axes = {
            axis: tuple(v for v in values if axis not in (only or {}) or filter_token(v) in only[axis])
            for axis, values in self.axes.items()
        }
        remaining = cell_bound(axes, self.include)
        if remaining > MAX_SCANNED:
            left = "--only leaves" if only else "without --only, this matrix has"
            raise SelectionError(
                f"{left} {remaining:,} cells for -k to read, more than the {MAX_SCANNED:,} it reads one at a time "
                f"(torchmatrix expands at most {MAX_CELLS:,}); add --only AXIS=VALUE, which prunes axes before any cell is made"
            )
        expression = KeywordExpression(keyword) if keyword else None
        kept = []
        for cell in iter_cells(axes, self.exclude, self.include):
            if (not only or passes_only(cell, only)) and (expression is None or expression.matches(cell.id)):
                kept.append(cell)
                if len(kept) > MAX_CELLS:
                    raise SelectionError(
                        f"the filters keep more than {MAX_CELLS:,} cells, the most torchmatrix runs from one matrix; "
                        "narrow them with more --only or -k"
                    )
        if not kept:
            raise SelectionError(
                "--only and -k keep no cell of this matrix; run `python -m torchmatrix list` with a narrower filter to see its cells"
            )
        _check_cells(self, kept, Where(_shown(self.path.name)))
        return shard_cells(kept, shard) if shard else kept

    @functools.cached_property
    def _expanded(self) -> tuple[Cell, ...]:
        """Expanded once: loading checks the ids and every command then selects from the same cells."""
        _refuse_too_many_cells(self, Where(_shown(self.path.name)))
        return tuple(expand_cells(self.axes, self.exclude, self.include))


MAX_MATRIX_BYTES = 4 * 1024 * 1024  # a matrix file is kilobytes; --config /dev/zero would read forever


def _read_matrix_file(path: Path) -> bytes:
    """The matrix file's bytes: a regular file of at most MAX_MATRIX_BYTES (a pipe would block forever)."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise ConfigError(
                f"{_shown(path)}: not a regular file (a device, a pipe or a directory); pass --config FILE"
            )
        with open(path, "rb") as file:
            raw_bytes = file.read(MAX_MATRIX_BYTES + 1)
    except OSError as error:
        raise ConfigError(
            f"{_shown(path)}: cannot read the matrix file ({error.strerror}); pass --config PATH"
        ) from None
    if len(raw_bytes) > MAX_MATRIX_BYTES:
        raise ConfigError(
            f"{_shown(path)}: over {MAX_MATRIX_BYTES // 2**20} MiB, not a matrix file; pass --config FILE"
        )
    return raw_bytes


def _shown(path: Path | str) -> str:
    """A path as one line of an error: quoted with escapes when it holds a newline or another control character."""
    text = str(path)
    return text if text.isprintable() else repr(text)


def load_matrix(path: str | Path) -> Matrix:
    """Read and validate matrix.toml; raise ConfigError naming the first problem found."""
    path = Path(path).resolve()
    where = Where(_shown(path.name))
    raw_bytes = _read_matrix_file(path)
    try:
        raw = tomllib.loads(raw_bytes.decode("utf-8-sig"))  # a BOM (some Windows editors write one) is not TOML's
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{_shown(path.name)}: not valid TOML ({error}); fix the syntax") from None

    where.unknown_keys(raw, TOP_LEVEL_KEYS, "")
    versions, baseline, installs = read_torch(raw, where)
    axes = read_axes(raw, where)
    exclude = tuple(
        read_exclude(entry, axes, where.at(f"exclude[{i}]"))
        for i, entry in enumerate(where.list_of_tables(raw, "exclude"))
    )
    include = tuple(
        read_include(entry, axes, where.at(f"include[{i}]"))
        for i, entry in enumerate(where.list_of_tables(raw, "include"))
    )
    suites = read_suites(raw, axes, path.parent, read_project_root(raw, path.parent, where), where)
    components = read_components(raw, where)
    requires = read_requires(raw, components, where)
    optional = read_optional(raw, components, versions, where)
    report = read_report(raw, where)
    known_failures = read_known_failures(raw, axes, suites, versions, where)
    matrix = Matrix(
        path=path,
        versions=versions,
        baseline=baseline,
        axes=axes,
        exclude=exclude,
        include=include,
        suites=suites,
        components=components,
        report=report,
        digest=hashlib.sha256(raw_bytes).hexdigest(),
        installs=installs,
        requires=requires,
        optional=optional,
        known_failures=known_failures,
        channels=parse_channels(raw["torch"].get("channels"), where.at("torch").at("channels")),
    )
    if cell_bound(axes, include) <= MAX_CELLS:  # a larger matrix is checked as --only and -k select from it
        _check_cells(matrix, matrix.cells(), where)
        _check_async_save(matrix, where)
    return matrix


def _check_async_save(matrix: Matrix, where: Where) -> None:
    """Every glob of resume's option `async_save` names a cell: one that names none (a typo, an axis value
    renamed) would leave every cell saving synchronously without a word."""
    resume = matrix.suites.get("resume")
    patterns = resume.options.async_save if resume is not None and isinstance(resume.options, ResumeOptions) else ()
    ids = [cell.id for cell in matrix.cells()]
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(cell_id, pattern) for cell_id in ids):
            raise (
                where.at("suites")
                .at("resume")
                .at("options")
                .at("async_save")
                .error(
                    f"{pattern!r} matches no cell id",
                    "run `python -m torchmatrix list` and copy an id, or a glob over ids",
                )
            )


def _refuse_too_many_cells(matrix: Matrix, where: Where) -> None:
    """One line, before anything expands, for a matrix whose axes multiply past MAX_CELLS."""
    bound = cell_bound(matrix.axes, matrix.include)
    if bound > MAX_CELLS:
        sizes = " x ".join(f"{len(values)} {axis}" for axis, values in matrix.axes.items())
        raise where.at("axes").error(
            f"{sizes} make {bound:,} cells, over the {MAX_CELLS:,} torchmatrix expands",
            "narrow this command with --only or -k, or split the matrix (fewer values per axis)",
        )


def _check_cells(matrix: Matrix, cells: list[Cell], where: Where) -> None:
    if not cells:
        raise where.at("exclude").error("every cell is excluded", "loosen the [[exclude]] entries")
    seen: dict[str, Cell] = {}
    for cell in cells:
        other = seen.setdefault(cell.id, cell)
        if other is not cell:
            raise where.at("include").error(
                f"cells {dict(other)} and {dict(cell)} would share the id {cell.id!r}",
                "make the include name every axis, or give the values distinct spellings",
            )
    if MESH_AXIS in matrix.axes:
        _check_meshes(matrix, cells, where)
    if PIPELINE_AXIS in matrix.axes:
        _check_pipelines(cells, where)


def _check_meshes(matrix: Matrix, cells: list[Cell], where: Where) -> None:
    """Every cell's mesh exists (torchmatrix.matrix.meshes): a 2-D mesh that no rank could build is a
    line here, naming the [[exclude]] that removes such cells, not a pile of skipped cells in every report."""
    for cell in cells:
        problem = mesh_problem(cell)
        if problem:
            raise where.at("axes").at(MESH_AXIS).error(f"cell {cell.id}: {problem}", _mesh_fix(matrix, cell))


def _check_pipelines(cells: list[Cell], where: Where) -> None:
    """Every pipelined cell can be trained so (torchmatrix.components.pipeline_axis): one line naming the
    cell and what it does not compose with, not an error in every rank."""
    for cell in cells:
        try:
            problem = pipeline_problem(cell)
        except ValueError as error:
            problem = str(error)
        if problem:
            raise (
                where.at("axes")
                .at(PIPELINE_AXIS)
                .error(
                    f"cell {cell.id}: {problem}",
                    "add an [[exclude]] for such cells, or change the [[include]] that adds it",
                )
            )


def _mesh_fix(matrix: Matrix, cell: Cell) -> str:
    """The exclude that drops every cell whose mesh cannot exist, as a user would write it."""
    kinds = [kind for kind in matrix.axes[MESH_AXIS] if kind in TWO_D_MESH_KINDS]
    if str(cell[MESH_AXIS]) not in MESH_KINDS:
        return f"use one of {', '.join(MESH_KINDS)}"
    if _fits(cell[MESH_AXIS], cell.world_size):
        other = [value for value in matrix.axes.get("fsdp", ()) if value != TWO_D_FSDP]
        exclude = f"[[exclude]] mesh = {json.dumps(kinds)}, fsdp = {json.dumps(other)}"
    else:
        sizes = [size for size in matrix.axes.get("world_size", ()) if not all(_fits(kind, size) for kind in kinds)]
        exclude = f"[[exclude]] mesh = {json.dumps(kinds)}, world_size = {json.dumps(sizes)}"
    from_include = any(cell[axis] not in matrix.axes.get(axis, ()) for axis in cell)
    return f"add {exclude}" + (" or change the [[include]] that adds this cell" if from_include else "")


def _fits(kind: str, world_size: int) -> bool:
    try:
        mesh_layout(kind, world_size)
    except ValueError:
        return False
    return True


def markdown_keys() -> str:
    """Every table matrix.toml accepts and the keys allowed in it, from the lists the loader checks."""

    def listed(keys: tuple[str, ...]) -> str:
        return ", ".join(f"`{key}`" for key in keys)

    defaults = ReportSettings()
    rows = [
        ("top level", listed(TOP_LEVEL_KEYS)),
        ("`[torch]`", listed(TORCH_KEYS)),
        ("`[torch.channels]`", listed(CHANNEL_KEYS)),
        ('`[torch.install."V"]`', listed(INSTALL_KEYS)),
        ("`[axes]`", f"any names matching `{NAME.pattern}`; numbers, booleans, or strings matching `{VALUE.pattern}`"),
        ("`[[exclude]]`, `[[include]]`", "names of `[axes]`"),
        ("`[[known_failure]]`", f"{listed(KNOWN_FAILURE_KEYS)} (`test` and `reason` required), and names of `[axes]`"),
        ("`[suites.<name>]`", f"{listed(SUITE_KEYS)}; `timeout` at most {MAX_TEST_TIMEOUT_S} s"),
        ("`[components]`", "any names; values `package.module:attribute`"),
        ("`[requires]`", "names of `[components]`"),
        (
            "`[optional]`",
            f"names of `[components]`; each `true` or a table of {listed(OPTIONAL_KEYS)} (devices: {listed(DEVICE_TYPES)})",
        ),
        ("`[report]`", ", ".join(f"`{key}` (default {getattr(defaults, key)})" for key in REPORT_KEYS)),
        ("`[project]`", listed(PROJECT_KEYS)),
    ]
    return "\n".join(["| table | keys |", "|---|---|", *(f"| {table} | {keys} |" for table, keys in rows)])
