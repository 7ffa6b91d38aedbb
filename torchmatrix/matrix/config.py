"""Load and validate matrix.toml into a `Matrix`.

Every problem a user can make in the file is reported as one `ConfigError` line that names the
file, the key path and what to change, so the CLI can print it and exit 2 without a traceback.
"""

from __future__ import annotations

import datetime
import fnmatch
import functools
import hashlib
import json
import math
import re
import stat
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from torchmatrix.components.loading import IMPORT_PATH
from torchmatrix.components.optional import DEVICE_TYPES, OptionalWhere
from torchmatrix.components.pipeline_axis import PIPELINE_AXIS, pipeline_problem
from torchmatrix.matrix.builtin_suites import BUILTIN_SUITES, builtin_suite_path, is_builtin_suite
from torchmatrix.matrix.cells import (
    MAX_CELLS,
    MAX_SCANNED,
    Cell,
    cell_bound,
    expand_cells,
    filter_token,
    iter_cells,
    value_token,
)
from torchmatrix.matrix.channels import CHANNEL_KEYS, INDEX_URL, Channels, channel_of, parse_channels
from torchmatrix.matrix.known_failures import KEYS as KNOWN_FAILURE_KEYS
from torchmatrix.matrix.known_failures import KnownFailure, KnownFailureError, read_known_failure
from torchmatrix.matrix.meshes import MESH_AXIS, MESH_KINDS, TWO_D_FSDP, TWO_D_MESH_KINDS, mesh_layout, mesh_problem
from torchmatrix.matrix.selection import (
    EVERY_CELL,
    CellSelection,
    KeywordExpression,
    SelectionError,
    passes_only,
    select_cells,
    shard_cells,
)
from torchmatrix.matrix.suite_options import OptionError
from torchmatrix.matrix.torch_versions import is_torch_version, nearest_spelling
from torchmatrix.user_error import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

NAME = re.compile(r"^[a-z][a-z0-9_]*$")
VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+]*$")
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
TORCH_KEYS = ("versions", "baseline", "install", "channels")
SUITE_KEYS = ("path", "timeout", "axes", "options")
INSTALL_KEYS = ("index_url", "requirements", "constraints", "env")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
REPORT_KEYS = ("drift_ratio", "slowdown_ratio", "memory_ratio", "prerelease_blocks")
PROJECT_KEYS = ("root",)
OPTIONAL_KEYS = ("device", "torch")
MAX_TEST_TIMEOUT_S = 86400
TOML_DATES = (datetime.date, datetime.time)  # datetime.datetime is a date


class ConfigError(UserError):
    """A problem in matrix.toml, phrased as one line that says where and what to change."""


@dataclass(frozen=True)
class Suite:
    """A pytest module run once per distinct combination of the axes it depends on."""

    name: str
    path: str
    timeout: float
    axes: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class TorchInstall:
    """How one torch version is installed: its index, what goes in beside it, its environment.

    The environment variables are set for the install and for the run of that version's cells.
    """

    index_url: str | None = None
    requirements: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class ReportSettings:
    """Thresholds the upgrade diff uses to call drift, slowdown or grown memory significant."""

    drift_ratio: float = 10.0
    slowdown_ratio: float = 1.5
    memory_ratio: float = 1.25
    prerelease_blocks: bool = False  # whether a nightly or rc failure fails the exit code (reports/prerelease.py)


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
        _check_cells(self, kept, _Where(_shown(self.path.name)))
        return shard_cells(kept, shard) if shard else kept

    @functools.cached_property
    def _expanded(self) -> tuple[Cell, ...]:
        """Expanded once: loading checks the ids and every command then selects from the same cells."""
        _refuse_too_many_cells(self, _Where(_shown(self.path.name)))
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
    where = _Where(_shown(path.name))
    raw_bytes = _read_matrix_file(path)
    try:
        raw = tomllib.loads(raw_bytes.decode("utf-8-sig"))  # a BOM (some Windows editors write one) is not TOML's
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{_shown(path.name)}: not valid TOML ({error}); fix the syntax") from None

    where.unknown_keys(raw, TOP_LEVEL_KEYS, "")
    versions, baseline, installs = _torch(raw, where)
    axes = _axes(raw, where)
    exclude = tuple(
        _exclude_entry(entry, axes, where.at(f"exclude[{i}]"))
        for i, entry in enumerate(where.list_of_tables(raw, "exclude"))
    )
    include = tuple(
        _include_entry(entry, axes, where.at(f"include[{i}]"))
        for i, entry in enumerate(where.list_of_tables(raw, "include"))
    )
    suites = _suites(raw, axes, path.parent, _project_root(raw, path.parent, where), where)
    components = _components(raw, where)
    requires = _requires(raw, components, where)
    optional = _optional(raw, components, versions, where)
    report = _report(raw, where)
    known_failures = _known_failures(raw, axes, suites, versions, where)
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


def _check_async_save(matrix: Matrix, where: _Where) -> None:
    """Every glob of resume's option `async_save` names a cell: one that names none (a typo, an axis value
    renamed) would leave every cell saving synchronously without a word."""
    resume = matrix.suites.get("resume")
    patterns = resume.options.get("async_save", ()) if resume is not None else ()
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


class _Where:
    """Formats error lines as `<file>: <key path>: <problem>; <fix>`."""

    def __init__(self, filename: str, key: str = ""):
        self.filename = filename
        self.key = key

    def at(self, key: str) -> _Where:
        return _Where(self.filename, f"{self.key}.{key}" if self.key else key)

    def index(self, i: int) -> _Where:
        return _Where(self.filename, f"{self.key}[{i}]")

    def error(self, problem: str, fix: str) -> ConfigError:
        location = f"{self.filename}: {self.key}" if self.key else self.filename
        return ConfigError(f"{location}: {problem}; {fix}")

    def unknown_keys(self, table: dict, allowed: tuple[str, ...], what: str) -> None:
        for key in table:
            if key not in allowed:
                raise self.at(key).error(f"unknown key{what}", f"use one of: {', '.join(allowed)}")

    def table(self, raw: dict, key: str, *, required: bool) -> dict:
        value = raw.get(key)
        if value is None:
            if required:
                raise self.at(key).error("missing", f"add a [{key}] table")
            return {}
        if not isinstance(value, dict):
            raise self.at(key).error(f"must be a table, not {_type_name(value)}", f"write it as [{key}]")
        return value

    def list_of_tables(self, raw: dict, key: str) -> list[dict]:
        value = raw.get(key, [])
        if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
            raise self.at(key).error("must be an array of tables", f"write each entry as [[{key}]]")
        return value


def _type_name(value: Any) -> str:
    return {
        str: "a string",
        int: "an integer",
        float: "a float",
        bool: "a boolean",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def _torch(raw: dict, where: _Where) -> tuple[tuple[str, ...], str, dict[str, TorchInstall]]:
    table = where.table(raw, "torch", required=True)
    where = where.at("torch")
    where.unknown_keys(table, TORCH_KEYS, " in [torch]")
    versions = table.get("versions")
    if not isinstance(versions, list) or not versions:
        raise where.at("versions").error(
            "must be a non-empty array of version strings", 'write e.g. versions = ["2.13.0", "2.14.1"]'
        )
    for i, version in enumerate(versions):
        if not is_torch_version(version):
            nearest = nearest_spelling(version) if isinstance(version, str) else None
            raise (
                where.at("versions")
                .index(i)
                .error(
                    f"{version!r} is not a PEP 440 torch version pip can install",
                    f'did you mean "{nearest}"?'
                    if nearest
                    else 'write a pip version such as "2.13.0" or "2.13.0+cu121", or "system" for the installed torch',
                )
            )
    duplicates = sorted({v for v in versions if versions.count(v) > 1})
    if duplicates:
        raise where.at("versions").error(f"{duplicates[0]!r} is listed twice", "list each version once")
    baseline = table.get("baseline", versions[0])
    if baseline not in versions:
        raise where.at("baseline").error(
            f"{baseline!r} is not among versions {versions}", "set baseline to one of the listed versions"
        )
    return tuple(versions), baseline, _installs(table, versions, where)


def _installs(table: dict, versions: list[str], where: _Where) -> dict[str, TorchInstall]:
    installs = table.get("install", {})
    where = where.at("install")
    if not isinstance(installs, dict):
        raise where.error(f"must be a table, not {_type_name(installs)}", 'write [torch.install."<version>"] tables')
    result = {}
    for version, spec in installs.items():
        at = where.at(f'"{version}"')
        if (version not in versions and version not in CHANNEL_KEYS) or version == "system":
            raise at.error(
                f"{version!r} is not an installable version in [torch].versions",
                "name a listed pip version, or add it to versions",
            )
        if not isinstance(spec, dict):
            raise at.error(f"must be a table, not {_type_name(spec)}", f'write it as [torch.install."{version}"]')
        at.unknown_keys(spec, INSTALL_KEYS, f' in [torch.install."{version}"]')
        index_url = spec.get("index_url")
        if index_url is not None and (not isinstance(index_url, str) or not INDEX_URL.match(index_url)):
            raise at.at("index_url").error(
                f"{index_url!r} is not an index URL",
                'write e.g. index_url = "https://download.pytorch.org/whl/nightly/cpu"',
            )
        env = spec.get("env", {})
        if not isinstance(env, dict):
            raise at.at("env").error(f"must be a table, not {_type_name(env)}", 'write env = { NAME = "value" }')
        for name, value in env.items():
            if not ENV_NAME.match(name) or not isinstance(value, str):
                raise (
                    at.at("env")
                    .at(name)
                    .error("must be an environment variable name set to a string", 'write NAME = "value"')
                )
        result[version] = TorchInstall(
            index_url=index_url,
            requirements=_requirements(spec.get("requirements", []), at.at("requirements")),
            constraints=_requirements(spec.get("constraints", []), at.at("constraints")),
            env=dict(env),
        )
    return result


def _requirements(value: Any, where: _Where) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise where.error(f"must be an array, not {_type_name(value)}", 'write e.g. ["numpy<2"]')
    for i, text in enumerate(value):
        try:
            requirement = Requirement(text) if isinstance(text, str) else None
        except InvalidRequirement as error:
            raise where.index(i).error(
                f"{text!r} is not a pip requirement ({str(error).splitlines()[0]})", 'write e.g. "numpy<2"'
            ) from None
        if requirement is None:
            raise where.index(i).error(f"{text!r} is not a string", 'write e.g. "numpy<2"')
        if requirement.name.lower() == "torch":
            raise where.index(i).error(
                "names torch, which [torch].versions pins", "list the version in versions instead"
            )
    return tuple(value)


def _scalar_ok(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, (int, float)):
        return math.isfinite(value) and "-" not in str(value)
    return isinstance(value, str) and bool(VALUE.match(value))


def _check_value(axis: str, value: Any, where: _Where) -> None:
    if not _scalar_ok(value):
        raise where.error(
            f"{value!r} is not a valid axis value",
            "use a finite number without '-' (it separates values in cell ids), a boolean, or a string of letters, digits, '_', '.' and '+' that starts with a letter or digit",
        )
    if axis == "world_size" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise where.error(f"{value!r} is not a world size", "use a positive integer GPU count")


# Keys the cell's JSON (`list --json`, github-matrix) holds beside its axis values.
RESERVED_AXIS_NAMES = {"id": "is the key that holds the cell id in `list --json`"}


def _axes(raw: dict, where: _Where) -> dict[str, tuple[Any, ...]]:
    table = where.table(raw, "axes", required=True)
    where = where.at("axes")
    if not table:
        raise where.error("no axes defined", "add at least one axis, e.g. world_size = [1, 2]")
    axes = {}
    for name, values in table.items():
        at = where.at(name)
        if not NAME.match(name):
            raise at.error("axis names are lower-case identifiers", "rename it using a-z, 0-9 and _")
        if name in RESERVED_AXIS_NAMES:
            raise at.error(RESERVED_AXIS_NAMES[name], "rename the axis")
        if not isinstance(values, list):
            raise at.error(f"must be an array, not {_type_name(values)}", f"write {name} = [{values!r}]")
        if not values:
            raise at.error("has no values", "list at least one value or remove the axis")
        for i, value in enumerate(values):
            _check_value(name, value, at.index(i))
        tokens = [value_token(name, v) for v in values]
        duplicate = next((v for v, t in zip(values, tokens) if tokens.count(t) > 1), None)
        if duplicate is not None:
            raise at.error(f"value {duplicate!r} is listed twice", "list each value once")
        axes[name] = tuple(values)
    return axes


def _exclude_entry(entry: dict, axes: dict, where: _Where) -> dict[str, Any]:
    if not entry:
        raise where.error("is empty and would exclude every cell", "name at least one axis value")
    for axis, value in entry.items():
        at = where.at(axis)
        if axis not in axes:
            raise at.error("is not an axis", f"exclude only names axes from [axes]: {', '.join(axes)}")
        known = {value_token(axis, a) for a in axes[axis]}
        for v in value if isinstance(value, list) else [value]:
            if not _scalar_ok(v) or value_token(axis, v) not in known:
                raise at.error(
                    f"{v!r} is not a value of [axes].{axis} {list(axes[axis])}",
                    "fix the value, or the exclude can never match",
                )
    return dict(entry)


def _include_entry(entry: dict, axes: dict, where: _Where) -> dict[str, Any]:
    if not entry:
        raise where.error("is empty", "name the axis values the include adds or extends")
    for axis, value in entry.items():
        at = where.at(axis)
        if axis not in axes:
            raise at.error("is not an axis", f"include only names axes from [axes]: {', '.join(axes)}")
        if isinstance(value, list):
            raise at.error("must be a single value", "write one [[include]] entry per value")
        _check_value(axis, value, at)
    return dict(entry)


def _known_failures(
    raw: dict, axes: dict, suites: dict[str, Suite], versions: tuple[str, ...], where: _Where
) -> tuple[KnownFailure, ...]:
    entries = []
    for i, entry in enumerate(where.list_of_tables(raw, "known_failure")):
        at = where.at(f"known_failure[{i}]")
        try:
            known = read_known_failure(entry, axes, tuple(suites))
        except KnownFailureError as error:
            raise at.at(error.key).error(error.problem, error.fix) from None
        stray = [version for version in known.torch if version not in (*versions, "system")]
        if stray:
            raise at.at("torch").error(
                f"{stray[0]!r} is not in [torch].versions {list(versions)}", "list versions of this matrix"
            )
        entries.append(known)
    return tuple(entries)


def _suites(raw: dict, axes: dict, root: Path, project: Path, where: _Where) -> dict[str, Suite]:
    table = where.table(raw, "suites", required=True)
    where = where.at("suites")
    if not table:
        raise where.error("no suites registered", "add e.g. [suites.collectives] (a built-in suite)")
    suites = {}
    for name, spec in table.items():
        at = where.at(name)
        if not NAME.match(name):
            raise at.error("suite names are lower-case identifiers", "rename it using a-z, 0-9 and _")
        if not isinstance(spec, dict):
            raise at.error(
                f"must be a table, not {_type_name(spec)}", f'write [suites.{name}] with path = "suites/..."'
            )
        at.unknown_keys(spec, SUITE_KEYS, f" in [suites.{name}]")
        if "path" in spec:
            path = _suite_path(spec["path"], root, project, at.at("path"))
            timeout, natural_axes = 300, tuple(axes)
        else:
            path = _builtin_path(name, at)
            timeout, natural_axes = BUILTIN_SUITES[name].timeout, BUILTIN_SUITES[name].axes or tuple(axes)
        options = _options(spec.get("options", {}), at.at("options"))
        if is_builtin_suite(name, path if "path" not in spec else str(root / path)):
            _check_options(name, options, at.at("options"))
        suites[name] = Suite(
            name=name,
            path=path,
            timeout=_test_timeout(spec.get("timeout", timeout), at.at("timeout")),
            axes=_suite_axes(spec.get("axes"), axes, at.at("axes"), natural_axes),
            options=options,
        )
    paths = [suite.path for suite in suites.values()]
    duplicate = next((p for p in paths if paths.count(p) > 1), None)
    if duplicate:
        raise where.error(f"two suites use the path {duplicate!r}", "register each pytest module once")
    return suites


def _builtin_path(name: str, where: _Where) -> str:
    """The installed file of the built-in suite `name`, absolute (it lies outside the user's project)."""
    if name not in BUILTIN_SUITES:
        raise where.error(
            f"no path, and {name!r} is not a built-in suite ({', '.join(BUILTIN_SUITES)})",
            f'name a built-in, or add path = "suites/test_{name}.py" for a suite of your own',
        )
    try:
        return builtin_suite_path(name).as_posix()
    except FileNotFoundError as error:
        raise where.error(f"{error}", "reinstall torchmatrix (pip install torchmatrix, or -e the checkout)") from None


def _suite_path(path: Any, root: Path, project: Path, where: _Where) -> str:
    if not isinstance(path, str) or not path:
        raise where.error("not a non-empty string", 'set path = "suites/test_<name>.py", or drop it for a built-in')
    candidate = Path(path)
    if candidate.is_absolute():
        raise where.error(f"{path!r} is absolute", "use a path relative to matrix.toml")
    target = (root / candidate).resolve()
    if ".." in candidate.parts and not target.is_relative_to(project):
        raise where.error(
            f"{path!r} leaves the project directory {project}",
            "name a built-in suite without path, or set [project] root to a directory that holds it",
        )
    if candidate.suffix != ".py" or not (root / candidate).is_file():
        raise where.error(
            f"{path!r} is not a Python file next to matrix.toml", "point it at an existing suites/test_*.py"
        )
    if not target.is_relative_to(project):
        raise where.error(
            f"{path!r} is a symlink to {target}, outside the project {project}",
            "copy the suite into the project, or set [project] root to a directory that holds it",
        )
    return candidate.as_posix()


def _project_root(raw: dict, matrix_dir: Path, where: _Where) -> Path:
    """The directory suite paths may resolve into, by `..` or a symlink: matrix.toml's own, or the
    `[project] root` the file names (suites shared by several projects under one root)."""
    table = where.table(raw, "project", required=False)
    where = where.at("project")
    where.unknown_keys(table, PROJECT_KEYS, " in [project]")
    root = table.get("root", ".")
    if not isinstance(root, str) or not root:
        raise where.at("root").error(f"{root!r} is not a directory path", 'write e.g. root = "../.."')
    resolved = (matrix_dir / root).resolve()
    if not resolved.is_dir():
        raise where.at("root").error(f"{root!r} is not a directory", "name the directory that holds the suites")
    return resolved


def _positive_number(value: Any, where: _Where, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
        raise where.error(f"{value!r} is not a positive number", f"set it in {unit} (finite)")
    return float(value)


def _test_timeout(value: Any, where: _Where) -> float:
    """A test's deadline in seconds: positive, finite, and at most MAX_TEST_TIMEOUT_S (a day),
    which keeps every wait the pool derives from it within what the OS timers accept."""
    seconds = _positive_number(value, where, "seconds per test")
    if seconds > MAX_TEST_TIMEOUT_S:
        raise where.error(
            f"{value!r} seconds is more than a day per test", f"set at most {MAX_TEST_TIMEOUT_S} (seconds per test)"
        )
    return seconds


def _suite_axes(value: Any, axes: dict, where: _Where, natural: tuple[str, ...]) -> tuple[str, ...]:
    """The listed axes, or the suite's natural ones that [axes] defines (every axis for a user's suite)."""
    if value is None:
        return tuple(a for a in axes if a in natural)
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise where.error(
            "must be an array of axis names", f"list the axes the suite's result depends on, from: {', '.join(axes)}"
        )
    for axis in value:
        if axis not in axes:
            raise where.error(f"{axis!r} is not an axis", f"use axes from [axes]: {', '.join(axes)}")
    if len(set(value)) != len(value):
        raise where.error("names an axis twice", "list each axis once")
    return tuple(a for a in axes if a in value)


def _options(value: Any, where: _Where) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise where.error(
            f"must be a table, not {_type_name(value)}", "write the suite's options as a table of key = value"
        )
    _refuse_dates(value, where)
    return dict(value)


def _check_options(suite: str, options: dict[str, Any], where: _Where) -> None:
    """A built-in suite's options against its dataclass (matrix/suite_options.py)."""
    try:
        BUILTIN_SUITES[suite].options.from_table(options, user=True)
    except OptionError as error:
        raise where.at(error.key).error(error.problem, error.fix) from None


def _refuse_dates(value: Any, where: _Where) -> None:
    """Options travel to the suites as JSON, which has no dates: a TOML date must be written as a string."""
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_dates(item, where.at(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _refuse_dates(item, where.index(i))
    elif isinstance(value, TOML_DATES):
        raise where.error(
            f"{value.isoformat()} is a TOML date, which the suites cannot receive", f'quote it: "{value.isoformat()}"'
        )


def _components(raw: dict, where: _Where) -> dict[str, str]:
    table = where.table(raw, "components", required=False)
    where = where.at("components")
    for name, path in table.items():
        at = where.at(name)
        if not NAME.match(name):
            raise at.error("component names are lower-case identifiers", "rename it using a-z, 0-9 and _")
        if not isinstance(path, str) or not IMPORT_PATH.match(path):
            raise at.error(f"{path!r} is not an import path", 'write it as "package.module:attribute"')
    return dict(table)


def _requires(raw: dict, components: dict[str, str], where: _Where) -> dict[str, tuple[str, ...]]:
    """`[requires]`: component key -> the pip requirements its module needs, installed into each
    torch venv by the matrix session (pins per torch version go in `[torch.install."V"].constraints`)."""
    table = where.table(raw, "requires", required=False)
    where = where.at("requires")
    for key in table:
        if key not in components:
            raise where.at(key).error(
                "is not a [components] key", f"name a component ({', '.join(components) or 'none defined'})"
            )
    return {key: _requirements(value, where.at(key)) for key, value in table.items()}


def _optional(
    raw: dict, components: dict[str, str], versions: tuple[str, ...], where: _Where
) -> dict[str, OptionalWhere]:
    """`[optional]`: component key -> where its packages may be missing (its cells then skip, not
    error): `true` for anywhere, or a table of `device` types and/or `torch` versions."""
    table = where.table(raw, "optional", required=False)
    where = where.at("optional")
    optional = {}
    for key, value in table.items():
        at = where.at(key)
        if key not in components:
            raise at.error("is not a [components] key", f"name a component ({', '.join(components) or 'none defined'})")
        if value is True:
            optional[key] = OptionalWhere()
            continue
        if not isinstance(value, dict) or not value:
            raise at.error(
                f"{value!r} is not where the component is optional",
                'write true (anywhere) or a table such as { device = ["cpu"] } or { torch = ["2.13.0"] }',
            )
        at.unknown_keys(value, OPTIONAL_KEYS, f" in [optional].{key}")
        optional[key] = OptionalWhere(
            devices=_listed(value, "device", DEVICE_TYPES, at, "device type"),
            torch=_listed(value, "torch", versions, at, "version in [torch].versions"),
        )
    return optional


def _listed(table: dict, key: str, allowed: tuple[str, ...], where: _Where, what: str) -> tuple[str, ...]:
    """`table[key]`, a non-empty array whose every entry is one of `allowed`; () when the key is absent."""
    if key not in table:
        return ()
    value, where = table[key], where.at(key)
    if not isinstance(value, list) or not value:
        raise where.error(f"{value!r} is not a non-empty array", f'write e.g. {key} = ["{allowed[0]}"]')
    for i, entry in enumerate(value):
        if entry not in allowed:
            raise where.index(i).error(f"{entry!r} is not a {what}", f"use one of: {', '.join(allowed)}")
    return tuple(value)


def _report(raw: dict, where: _Where) -> ReportSettings:
    table = where.table(raw, "report", required=False)
    where = where.at("report")
    where.unknown_keys(table, REPORT_KEYS, " in [report]")
    values: dict[str, Any] = {
        key: _positive_number(table[key], where.at(key), "a ratio, e.g. 10 for ten times")
        for key in REPORT_KEYS[:-1]
        if key in table
    }
    if not isinstance(table.get("prerelease_blocks", False), bool):
        raise where.at("prerelease_blocks").error("must be true or false", "write prerelease_blocks = true")
    return ReportSettings(**values, prerelease_blocks=table.get("prerelease_blocks", False))


def _refuse_too_many_cells(matrix: Matrix, where: _Where) -> None:
    """One line, before anything expands, for a matrix whose axes multiply past MAX_CELLS."""
    bound = cell_bound(matrix.axes, matrix.include)
    if bound > MAX_CELLS:
        sizes = " x ".join(f"{len(values)} {axis}" for axis, values in matrix.axes.items())
        raise where.at("axes").error(
            f"{sizes} make {bound:,} cells, over the {MAX_CELLS:,} torchmatrix expands",
            "narrow this command with --only or -k, or split the matrix (fewer values per axis)",
        )


def _check_cells(matrix: Matrix, cells: list[Cell], where: _Where) -> None:
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


def _check_meshes(matrix: Matrix, cells: list[Cell], where: _Where) -> None:
    """Every cell's mesh exists (torchmatrix.matrix.meshes): a 2-D mesh that no rank could build is a
    line here, naming the [[exclude]] that removes such cells, not a pile of skipped cells in every report."""
    for cell in cells:
        problem = mesh_problem(cell)
        if problem:
            raise where.at("axes").at(MESH_AXIS).error(f"cell {cell.id}: {problem}", _mesh_fix(matrix, cell))


def _check_pipelines(cells: list[Cell], where: _Where) -> None:
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
