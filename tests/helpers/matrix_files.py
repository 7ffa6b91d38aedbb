"""matrix.toml text for a throwaway project, and the files of a minimal one."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

# The reference components the resume suite needs (matrix.toml's, without batch and TE).
REFERENCE_COMPONENTS = {
    "model": "torchmatrix.models.transformer:build_model",
    "parallelize": "torchmatrix.models.parallel:parallelize",
    "optimizer_adamw": "torchmatrix.models.optim:build_adamw",
    "optimizer_precision_aware": "torchmatrix.models.optim:build_precision_aware",
    "checkpointer": "torchmatrix.models.checkpoint:Checkpointer",
    "dataset": "torchmatrix.models.data:TokenDataset",
}


def matrix_toml(
    *,
    axes: Mapping[str, Sequence[object]],
    suites: Mapping[str, Mapping[str, object]],
    torch: Sequence[str] = ("system",),
    baseline: str | None = None,
    exclude: Sequence[Mapping[str, object]] = (),
    components: Mapping[str, str] | None = None,
    report: Mapping[str, object] | None = None,
) -> str:
    """matrix.toml text for a throwaway project, so a test states only what its matrix is about.

    A suite's `path` defaults to suites/test_<name>.py (`"path": None` leaves it out: the built-in
    suite of that name); a nested mapping (a suite's `options`) becomes its own table. Tests about malformed or hostile text write that text literally instead.
    """
    lines = _toml_table("torch", {"versions": list(torch), **({"baseline": baseline} if baseline else {})})
    lines += _toml_table("axes", axes)
    for rule in exclude:
        lines += _toml_table("exclude", rule, array=True)
    for name, suite in suites.items():
        table = {"path": f"suites/test_{name}.py", **suite}
        lines += _toml_table(f"suites.{name}", {key: value for key, value in table.items() if value is not None})
    if components:
        lines += _toml_table("components", components)
    if report:
        lines += _toml_table("report", report)
    return "\n".join(lines)


def include_table(entry: dict) -> str:
    """One [[include]] table of matrix.toml with these values."""
    values = "\n".join(f"{key} = {value!r}".replace("'", '"') for key, value in entry.items())
    return f"\n\n[[include]]\n{values}\n"


def write_matrix(root: Path, **sections) -> Path:
    """Write `matrix_toml(**sections)` to root/matrix.toml and return its path."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "matrix.toml"
    path.write_text(matrix_toml(**sections))
    return path


def write_demo_project(root: Path, **sections) -> Path:
    """A project at root whose one suite, `demo`, is a single trivial test, with matrix.toml from
    `sections` (`suites` defaults to just that one); returns root."""
    (root / "suites").mkdir(parents=True, exist_ok=True)
    (root / "suites" / "test_demo.py").write_text("def test_x(cell):\n    pass\n")
    write_matrix(root, **{"suites": {"demo": {}}, **sections})
    return root


def _toml_table(name: str, values: Mapping[str, object], array: bool = False) -> list[str]:
    """One TOML table (JSON spells its strings, numbers, booleans and lists as TOML does), then its subtables."""
    nested = {key: value for key, value in values.items() if isinstance(value, Mapping)}
    lines = [f"[[{name}]]" if array else f"[{name}]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in values.items() if key not in nested]
    lines.append("")
    for key, value in nested.items():
        lines += _toml_table(f"{name}.{key}", value)
    return lines
