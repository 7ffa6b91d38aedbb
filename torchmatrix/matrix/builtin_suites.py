"""The suites that ship with torchmatrix, which a matrix.toml names by `[suites.<name>]` alone.

They install as the package `torchmatrix.suites`; their files are found through the import
system without importing them (they import torch), so a user's repository needs no copy.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torchmatrix
from torchmatrix.matrix.suite_options import (
    CheckpointArchiveOptions,
    CollectivesOptions,
    CrossVersionOptions,
    DtensorOptimOptions,
    GradCkptOptions,
    ParallelEquivalenceOptions,
    PeakMemoryOptions,
    ResumeOptions,
    SuiteOptions,
    field_docs,
    toml_value,
)


@dataclass(frozen=True)
class BuiltinSuite:
    """A shipped suite's file and the defaults a path-less `[suites.<name>]` table gets."""

    file: str
    timeout: float
    options: type[SuiteOptions]
    """The dataclass its `[suites.<name>.options]` table is read into."""
    axes: tuple[str, ...] | None = None
    """The axes its result depends on; None: every axis of the matrix, since its tests hand the
    cell to the user's components, which may read any of them (torchtitan's `qkv`)."""


BUILTIN_SUITES = {
    "collectives": BuiltinSuite("test_collectives.py", 60, CollectivesOptions, ("world_size",)),
    "grad_ckpt": BuiltinSuite("test_grad_ckpt.py", 120, GradCkptOptions),
    "resume": BuiltinSuite("test_resume.py", 300, ResumeOptions),
    "dtensor_optim": BuiltinSuite("test_dtensor_optim.py", 300, DtensorOptimOptions),
    "cross_version": BuiltinSuite("test_cross_version.py", 300, CrossVersionOptions),
    "parallel_equivalence": BuiltinSuite("test_parallel_equivalence.py", 300, ParallelEquivalenceOptions),
    "peak_memory": BuiltinSuite("test_peak_memory.py", 300, PeakMemoryOptions),
    "checkpoint_archive": BuiltinSuite("test_checkpoint_archive.py", 300, CheckpointArchiveOptions, ("world_size",)),
}


def options_class(name: str) -> type[SuiteOptions]:
    """The built-in suites' options dataclass called `name`, as a group plan names it; a ValueError for any other."""
    classes = {suite.options.__name__: suite.options for suite in BUILTIN_SUITES.values()}
    if name not in classes:
        raise ValueError(f"{name!r} is not a built-in suite's options ({', '.join(classes)})")
    return classes[name]


def builtin_suite_path(name: str) -> Path:
    """The installed file of the built-in suite `name` (a key of BUILTIN_SUITES); for a torchmatrix
    imported from a checkout that is not installed (nox's own environment), the checkout's suites/."""
    spec = importlib.util.find_spec("torchmatrix.suites")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve() / BUILTIN_SUITES[name].file
    checkout_suites = Path(torchmatrix.__file__).resolve().parent.parent / "suites"
    if (checkout_suites / "__init__.py").is_file():
        return checkout_suites / BUILTIN_SUITES[name].file
    raise FileNotFoundError("torchmatrix.suites is not installed with this torchmatrix")


def is_builtin_suite(name: str, path: str | Path) -> bool:
    """Whether `path` is the file of the built-in suite `name`: a path-less table, or a path to the shipped file."""
    if name not in BUILTIN_SUITES:
        return False
    try:
        return Path(path).resolve() == builtin_suite_path(name).resolve()
    except FileNotFoundError:
        return False


def markdown_table() -> str:
    """The built-in suites and the defaults a path-less `[suites.<name>]` table gets, as the reference lists them."""
    rows = ["| suite | file | default timeout per test | axes its result depends on |", "|---|---|---|---|"]
    for name, suite in BUILTIN_SUITES.items():
        axes = ", ".join(f"`{axis}`" for axis in suite.axes) if suite.axes else "every axis"
        rows.append(f"| `{name}` | `suites/{suite.file}` | {suite.timeout:g} s | {axes} |")
    return "\n".join(rows)


def options_markdown() -> str:
    """Every built-in suite's options with default and meaning, from their dataclasses, as the reference lists them."""
    return "\n\n".join(_options_section(name, suite.options) for name, suite in BUILTIN_SUITES.items())


def _options_section(name: str, options: type[SuiteOptions]) -> str:
    header = f"`[suites.{name}.options]`"
    base = next((other for other, suite in BUILTIN_SUITES.items() if suite.options is options.__mro__[1]), None)
    if base:
        return f"{header}: those of `{base}`; the runner adds {', '.join(f'`{key}`' for key in options.RUNNER_SET)}."
    docs = field_docs(options)
    rows = [
        f"| `{field.name}` | {'unset' if field.default is None else f'`{toml_value(field.default)}`'} | {docs[field.name]} |"
        for field in dataclasses.fields(options)
    ]
    if not rows:
        return f"{header}: none."
    return "\n".join([f"{header}:", "", "| option | default | meaning |", "|---|---|---|", *rows])
