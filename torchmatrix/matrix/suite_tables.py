"""`[suites.<name>]` tables read and checked into `Suite`s: a built-in named without a path or a
pytest module inside the project, its deadline, the axes its result depends on, and its options."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchmatrix.matrix.builtin_suites import BUILTIN_SUITES, builtin_suite_path, is_builtin_suite
from torchmatrix.matrix.sections import TOML_DATES, Where, named_entries, positive_number, required_section, type_name
from torchmatrix.matrix.suite_options import OptionError, SuiteOptions

MAX_TEST_TIMEOUT_S = 86400
SUITE_KEYS = ("path", "timeout", "axes", "options")


@dataclass(frozen=True)
class Suite:
    """A pytest module run once per distinct combination of the axes it depends on."""

    name: str
    path: str
    timeout: float
    axes: tuple[str, ...]
    options: SuiteOptions | dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    """A built-in suite's options as its dataclass; a suite of the user's own keeps the table, since its
    module names its options class and imports torch, which only its pytest process does."""
    table: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    """`[suites.<name>.options]` as matrix.toml wrote it: what the compile store's key hashes (so stores
    stay warm however options are typed) and a reproducer inlines."""


def read_suites(raw: dict, axes: dict, root: Path, project: Path, where: Where) -> dict[str, Suite]:
    table, where = required_section(
        raw, "suites", where, "no suites registered", "add e.g. [suites.collectives] (a built-in suite)"
    )
    suites = {}
    for name, spec, at in named_entries(table, where, "suite"):
        if not isinstance(spec, dict):
            raise at.error(f"must be a table, not {type_name(spec)}", f'write [suites.{name}] with path = "suites/..."')
        at.unknown_keys(spec, SUITE_KEYS, f" in [suites.{name}]")
        if "path" in spec:
            path = _suite_path(spec["path"], root, project, at.at("path"))
            timeout, natural_axes = 300, tuple(axes)
        else:
            path = _builtin_path(name, at)
            timeout, natural_axes = BUILTIN_SUITES[name].timeout, BUILTIN_SUITES[name].axes or tuple(axes)
        written = _options(spec.get("options", {}), at.at("options"))
        options = written
        if is_builtin_suite(name, path if "path" not in spec else str(root / path)):
            options = _check_options(name, written, at.at("options"))
        suites[name] = Suite(
            name=name,
            path=path,
            timeout=_test_timeout(spec.get("timeout", timeout), at.at("timeout")),
            axes=_suite_axes(spec.get("axes"), axes, at.at("axes"), natural_axes),
            options=options,
            table=written,
        )
    paths = [suite.path for suite in suites.values()]
    duplicate = next((p for p in paths if paths.count(p) > 1), None)
    if duplicate:
        raise where.error(f"two suites use the path {duplicate!r}", "register each pytest module once")
    return suites


def _builtin_path(name: str, where: Where) -> str:
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


def _suite_path(path: Any, root: Path, project: Path, where: Where) -> str:
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


def _test_timeout(value: Any, where: Where) -> float:
    """A test's deadline in seconds: positive, finite, and at most MAX_TEST_TIMEOUT_S (a day),
    which keeps every wait the pool derives from it within what the OS timers accept."""
    seconds = positive_number(value, where, "seconds per test")
    if seconds > MAX_TEST_TIMEOUT_S:
        raise where.error(
            f"{value!r} seconds is more than a day per test", f"set at most {MAX_TEST_TIMEOUT_S} (seconds per test)"
        )
    return seconds


def _suite_axes(value: Any, axes: dict, where: Where, natural: tuple[str, ...]) -> tuple[str, ...]:
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


def _options(value: Any, where: Where) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise where.error(
            f"must be a table, not {type_name(value)}", "write the suite's options as a table of key = value"
        )
    _refuse_dates(value, where)
    return dict(value)


def _check_options(suite: str, options: dict[str, Any], where: Where) -> SuiteOptions:
    """A built-in suite's options read into its dataclass (matrix/suite_options.py), or the error naming the key."""
    try:
        return BUILTIN_SUITES[suite].options.from_table(options, user=True)
    except OptionError as error:
        raise where.at(error.key).error(error.problem, error.fix) from None


def _refuse_dates(value: Any, where: Where) -> None:
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
