"""plan.json: what one torch version of a run planned, written when the run starts and again when it ends.

Runs, merges and `report` read it back, possibly from a directory another job wrote (a CI
artifact, a shard), so every value is checked as it is read: a pin, cell id or suite name that
becomes a path must be a plain name, and the version must be the one its directory names.
"""

from __future__ import annotations

import json
from pathlib import Path

from torchmatrix.safe_names import UnsafeName, check_name

FILE_NAME = "plan.json"
VERSION_PREFIX = "torch-"


class PlanFileError(ValueError):
    """A plan.json that cannot be trusted or parsed; the message names the file and the value."""


def read_plan(path: Path) -> dict:
    """The plan in `path` (a `torch-<V>/plan.json`), checked; raise PlanFileError naming what is wrong."""
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PlanFileError(
            f"{path}: not a readable plan ({error}); delete that torch-* directory or rerun it"
        ) from None
    if not isinstance(plan, dict):
        raise PlanFileError(f"{path}: not a JSON object; delete that torch-* directory or rerun it")
    try:
        _check(plan, path)
    except UnsafeName as error:
        raise PlanFileError(f"{path}: {error}; refusing to use it") from None
    return plan


def _check(plan: dict, path: Path) -> None:
    version = check_name(plan.get("torch"), "torch version")
    if path.parent.name != VERSION_PREFIX + version:
        raise UnsafeName(f"torch version {version!r} is not the {path.parent.name!r} its directory names")
    for cell in _list(plan, "cells"):
        check_name(cell, "cell id")
    for cell in _list(plan, "missing"):
        check_name(cell, "cell id")
    for name in plan.get("suites") or {}:
        check_name(name, "suite name")
    for key in ("shard", "keyword", "matrix", "matrix_sha256"):
        if plan.get(key) is not None and not isinstance(plan[key], str):
            raise UnsafeName(f"{key} {plan[key]!r} is not text")
    only = plan.get("only") or {}
    if not isinstance(only, dict) or not all(
        isinstance(values, list) and all(isinstance(v, str) for v in values) for values in only.values()
    ):
        raise UnsafeName(f"only {only!r} is not a table of axis -> values")
    if not isinstance(plan.get("pool_starts", 0), int) or not isinstance(plan.get("environment") or {}, dict):
        raise UnsafeName("pool_starts or environment has the wrong type")


def _list(plan: dict, key: str) -> list:
    value = plan.get(key) or []
    if not isinstance(value, list):
        raise UnsafeName(f"{key} {value!r} is not a list")
    return value


def write_plan(version_dir: Path, plan: dict) -> Path:
    """Write `<version_dir>/plan.json` atomically (a reader never sees half of it)."""
    path = version_dir / FILE_NAME
    partial = path.with_name(f".{FILE_NAME}.partial")
    partial.write_text(json.dumps(plan, indent=2))
    partial.replace(path)
    return path
