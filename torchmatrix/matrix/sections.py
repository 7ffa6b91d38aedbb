"""The sections of matrix.toml, each read into its type and checked: `[torch]` and its install
tables, `[axes]`, `[[exclude]]` and `[[include]]`, `[components]`, `[requires]`, `[optional]`,
`[[known_failure]]`, `[report]` and `[project]` (`[suites]` in suite_tables), every problem one
`ConfigError` line that says where and what to change."""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.requirements import InvalidRequirement, Requirement

from torchmatrix.components.loading import IMPORT_PATH
from torchmatrix.components.optional import DEVICE_TYPES, OptionalWhere
from torchmatrix.matrix.cells import (
    value_token,
)
from torchmatrix.matrix.channels import CHANNEL_KEYS, INDEX_URL
from torchmatrix.matrix.known_failures import KnownFailure, KnownFailureError, read_known_failure
from torchmatrix.matrix.torch_versions import is_torch_version, nearest_spelling
from torchmatrix.user_error import UserError

if TYPE_CHECKING:
    from torchmatrix.matrix.suite_tables import Suite


NAME = re.compile(r"^[a-z][a-z0-9_]*$")
VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+]*$")
TORCH_KEYS = ("versions", "baseline", "install", "channels")
INSTALL_KEYS = ("index_url", "requirements", "constraints", "env")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
REPORT_KEYS = ("drift_ratio", "slowdown_ratio", "memory_ratio", "prerelease_blocks")
PROJECT_KEYS = ("root",)
OPTIONAL_KEYS = ("device", "torch")
TOML_DATES = (datetime.date, datetime.time)  # datetime.datetime is a date


class ConfigError(UserError):
    """A problem in matrix.toml, phrased as one line that says where and what to change."""


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


class Where:
    """Formats error lines as `<file>: <key path>: <problem>; <fix>`."""

    def __init__(self, filename: str, key: str = ""):
        self.filename = filename
        self.key = key

    def at(self, key: str) -> Where:
        return Where(self.filename, f"{self.key}.{key}" if self.key else key)

    def index(self, i: int) -> Where:
        return Where(self.filename, f"{self.key}[{i}]")

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
            raise self.at(key).error(f"must be a table, not {type_name(value)}", f"write it as [{key}]")
        return value

    def list_of_tables(self, raw: dict, key: str) -> list[dict]:
        value = raw.get(key, [])
        if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
            raise self.at(key).error("must be an array of tables", f"write each entry as [[{key}]]")
        return value


def required_section(raw: dict, section: str, where: Where, empty: str, fix: str) -> tuple[dict, Where]:
    """The table `section` and where it is, refused with `empty` and `fix` where it has no entries."""
    table = where.table(raw, section, required=True)
    where = where.at(section)
    if not table:
        raise where.error(empty, fix)
    return table, where


def named_entries(table: dict, where: Where, noun: str) -> Iterator[tuple[str, Any, Where]]:
    """Each entry of the section `table` at `where` and where it is, once its name is a lower-case identifier."""
    for name, value in table.items():
        at = where.at(name)
        if not NAME.match(name):
            raise at.error(f"{noun} names are lower-case identifiers", "rename it using a-z, 0-9 and _")
        yield name, value, at


def type_name(value: Any) -> str:
    return {
        str: "a string",
        int: "an integer",
        float: "a float",
        bool: "a boolean",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def read_torch(raw: dict, where: Where) -> tuple[tuple[str, ...], str, dict[str, TorchInstall]]:
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


def _installs(table: dict, versions: list[str], where: Where) -> dict[str, TorchInstall]:
    installs = table.get("install", {})
    where = where.at("install")
    if not isinstance(installs, dict):
        raise where.error(f"must be a table, not {type_name(installs)}", 'write [torch.install."<version>"] tables')
    result = {}
    for version, spec in installs.items():
        at = where.at(f'"{version}"')
        if (version not in versions and version not in CHANNEL_KEYS) or version == "system":
            raise at.error(
                f"{version!r} is not an installable version in [torch].versions",
                "name a listed pip version, or add it to versions",
            )
        if not isinstance(spec, dict):
            raise at.error(f"must be a table, not {type_name(spec)}", f'write it as [torch.install."{version}"]')
        at.unknown_keys(spec, INSTALL_KEYS, f' in [torch.install."{version}"]')
        index_url = spec.get("index_url")
        if index_url is not None and (not isinstance(index_url, str) or not INDEX_URL.match(index_url)):
            raise at.at("index_url").error(
                f"{index_url!r} is not an index URL",
                'write e.g. index_url = "https://download.pytorch.org/whl/nightly/cpu"',
            )
        env = spec.get("env", {})
        if not isinstance(env, dict):
            raise at.at("env").error(f"must be a table, not {type_name(env)}", 'write env = { NAME = "value" }')
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


def _requirements(value: Any, where: Where) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise where.error(f"must be an array, not {type_name(value)}", 'write e.g. ["numpy<2"]')
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


def _check_value(axis: str, value: Any, where: Where) -> None:
    if not _scalar_ok(value):
        raise where.error(
            f"{value!r} is not a valid axis value",
            "use a finite number without '-' (it separates values in cell ids), a boolean, or a string of letters, digits, '_', '.' and '+' that starts with a letter or digit",
        )
    if axis == "world_size" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise where.error(f"{value!r} is not a world size", "use a positive integer GPU count")


# Keys the cell's JSON (`list --json`, github-matrix) holds beside its axis values.
RESERVED_AXIS_NAMES = {"id": "is the key that holds the cell id in `list --json`"}


def read_axes(raw: dict, where: Where) -> dict[str, tuple[Any, ...]]:
    table, where = required_section(
        raw, "axes", where, "no axes defined", "add at least one axis, e.g. world_size = [1, 2]"
    )
    axes = {}
    for name, values, at in named_entries(table, where, "axis"):
        if name in RESERVED_AXIS_NAMES:
            raise at.error(RESERVED_AXIS_NAMES[name], "rename the axis")
        if not isinstance(values, list):
            raise at.error(f"must be an array, not {type_name(values)}", f"write {name} = [{values!r}]")
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


def read_exclude(entry: dict, axes: dict, where: Where) -> dict[str, Any]:
    empty = ("is empty and would exclude every cell", "name at least one axis value")
    for axis, value, at in _axis_entries(entry, axes, where, "exclude", empty):
        known = {value_token(axis, a) for a in axes[axis]}
        for v in value if isinstance(value, list) else [value]:
            if not _scalar_ok(v) or value_token(axis, v) not in known:
                raise at.error(
                    f"{v!r} is not a value of [axes].{axis} {list(axes[axis])}",
                    "fix the value, or the exclude can never match",
                )
    return dict(entry)


def read_include(entry: dict, axes: dict, where: Where) -> dict[str, Any]:
    empty = ("is empty", "name the axis values the include adds or extends")
    for axis, value, at in _axis_entries(entry, axes, where, "include", empty):
        if isinstance(value, list):
            raise at.error("must be a single value", "write one [[include]] entry per value")
        _check_value(axis, value, at)
    return dict(entry)


def _axis_entries(
    entry: dict, axes: dict, where: Where, kind: str, empty: tuple[str, str]
) -> Iterator[tuple[str, Any, Where]]:
    """Each axis of an [[exclude]] or [[include]] entry with its value and where it is, refused with the
    `empty` problem and fix where the entry names none, or where it names no axis of [axes]."""
    if not entry:
        raise where.error(*empty)
    for axis, value in entry.items():
        at = where.at(axis)
        if axis not in axes:
            raise at.error("is not an axis", f"{kind} only names axes from [axes]: {', '.join(axes)}")
        yield axis, value, at


def read_known_failures(
    raw: dict, axes: dict, suites: dict[str, Suite], versions: tuple[str, ...], where: Where
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


def read_project_root(raw: dict, matrix_dir: Path, where: Where) -> Path:
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


def read_components(raw: dict, where: Where) -> dict[str, str]:
    table = where.table(raw, "components", required=False)
    where = where.at("components")
    for _, path, at in named_entries(table, where, "component"):
        if not isinstance(path, str) or not IMPORT_PATH.match(path):
            raise at.error(f"{path!r} is not an import path", 'write it as "package.module:attribute"')
    return dict(table)


def read_requires(raw: dict, components: dict[str, str], where: Where) -> dict[str, tuple[str, ...]]:
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


def read_optional(
    raw: dict, components: dict[str, str], versions: tuple[str, ...], where: Where
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


def _listed(table: dict, key: str, allowed: tuple[str, ...], where: Where, what: str) -> tuple[str, ...]:
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


def positive_number(value: Any, where: Where, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
        raise where.error(f"{value!r} is not a positive number", f"set it in {unit} (finite)")
    return float(value)


def read_report(raw: dict, where: Where) -> ReportSettings:
    table = where.table(raw, "report", required=False)
    where = where.at("report")
    where.unknown_keys(table, REPORT_KEYS, " in [report]")
    values: dict[str, Any] = {
        key: positive_number(table[key], where.at(key), "a ratio, e.g. 10 for ten times")
        for key in REPORT_KEYS[:-1]
        if key in table
    }
    if not isinstance(table.get("prerelease_blocks", False), bool):
        raise where.at("prerelease_blocks").error("must be true or false", "write prerelease_blocks = true")
    return ReportSettings(**values, prerelease_blocks=table.get("prerelease_blocks", False))
