"""plan.json: what one torch version of a run planned, written when the run starts and again when it ends.

Runs, merges and `report` read it back, possibly from a directory another job wrote (a CI
artifact, a shard), so every value is checked as it is read: a pin, cell id or suite name that
becomes a path must be a plain name, and the version must be the one its directory names. The
file outlives its run, so it carries a format version; files from before it count as format 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from torchmatrix import file_writes, json_records
from torchmatrix.env.devices import Environment
from torchmatrix.json_records import JsonRecord, json_field
from torchmatrix.matrix.safe_names import UnsafeName, check_name
from torchmatrix.matrix.selection import EVERY_CELL, CellSelection
from torchmatrix.messages import run_tree
from torchmatrix.messages.run_tree import ForeignEntry
from torchmatrix.user_error import UserError

FILE_NAME = "plan.json"
VERSION_PREFIX = "torch-"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class PlannedSuite(JsonRecord):
    """A suite as planned: where its tests are, their deadline, and the axes its runs depend on."""

    ignores_unknown_keys = True

    path: str = field(metadata=json_field(load=str))
    timeout: float = field(metadata=json_field(load=float))  # read as a number, or the plan is refused
    axes: tuple[str, ...] = ()


def _environment_read(recorded: dict) -> Environment | None:
    return Environment.from_json(recorded) if recorded else None


@dataclass(frozen=True)
class RunPlan(JsonRecord):
    """One torch version's plan: its cells (ids and axis values), suites, filters and environment.

    A merged version (from shards) also names the cells no shard delivered (`missing`) and where
    each input came from (`merged_from`); `finished` is False while the runner is still going;
    `load_average` is the machine's 1-minute load while it ran (mean, max, samples, cores).
    """

    json_header = {"format_version": FORMAT_VERSION}
    ignores_unknown_keys = True  # the file outlives its run: a key a later torchmatrix adds is no error

    torch: str
    cells: tuple[str, ...] = ()
    environment: Environment | None = field(
        default=None, metadata=json_field(dump=lambda e: {} if e is None else e.to_json(), load=_environment_read)
    )
    """The version's torch build and device, as probed; None where none was recorded (`{}` in the file)."""
    started: str | None = None
    matrix: str | None = None
    matrix_sha256: str | None = None
    baseline: str | None = None
    thresholds: dict = field(default_factory=dict)
    """The matrix's `[report]` ratios: `report` and `compare` read them here, never from the matrix path recorded above."""
    selection: CellSelection = field(default=EVERY_CELL, metadata=json_field(inline=True))
    """The cells the version was run with (`--only`, `-k`, `--shard`), under the keys only, keyword and shard."""
    cell_axes: tuple[dict, ...] = ()
    suites: dict[str, PlannedSuite] = field(default_factory=dict)
    pool_starts: int = 0
    finished: bool = False
    missing: tuple[str, ...] = ()
    merged_from: tuple[dict, ...] = ()
    load_average: dict = field(default_factory=dict)

    @property
    def filters(self) -> dict:
        """The filters the version was run with (only, keyword, shard) as plan.json spells them, those that were set."""
        return {key: value for key, value in json_records.to_json(self.selection).items() if value}


class PlanFileError(UserError, ValueError):
    """A plan.json that cannot be trusted or parsed; the message names the file and the value."""


def read_plan(path: Path) -> RunPlan:
    """The plan in `path` (a `torch-<V>/plan.json`), checked; raise PlanFileError naming what is wrong."""
    try:
        plan = json.loads(run_tree.read_text(path))
    except ForeignEntry as error:
        raise PlanFileError(str(error)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PlanFileError(
            f"{path}: not a readable plan ({error}); delete that torch-* directory or rerun it"
        ) from None
    if not isinstance(plan, dict):
        raise PlanFileError(f"{path}: not a JSON object; delete that torch-* directory or rerun it")
    if plan.get("format_version", FORMAT_VERSION) != FORMAT_VERSION:
        raise PlanFileError(
            f"{path}: a plan of format {plan['format_version']!r}, not {FORMAT_VERSION} (written by another torchmatrix version); "
            "rerun that torch version or report it with the torchmatrix that wrote it"
        )
    try:
        _check(plan, path)
        return RunPlan.from_json(plan)
    except UnsafeName as error:
        raise PlanFileError(f"{path}: {error}; refusing to use it") from None
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise PlanFileError(
            f"{path}: not a plan this torchmatrix wrote ({error!r}); rerun that torch version"
        ) from None


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
    if not isinstance(plan.get("load_average") or {}, dict):
        raise UnsafeName("load_average is not a table")
    if not isinstance(plan.get("pool_starts", 0), int) or not isinstance(plan.get("environment") or {}, dict):
        raise UnsafeName("pool_starts or environment has the wrong type")


def _list(plan: dict, key: str) -> list:
    value = plan.get(key) or []
    if not isinstance(value, list):
        raise UnsafeName(f"{key} {value!r} is not a list")
    return value


def write_plan(version_dir: Path, plan: RunPlan) -> Path:
    """Write `<version_dir>/plan.json` atomically (a reader never sees half of it)."""
    version_dir.mkdir(parents=True, exist_ok=True)
    return file_writes.write_text(version_dir / FILE_NAME, json.dumps(plan.to_json(), indent=2))
