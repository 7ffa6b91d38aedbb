"""The group plan: what the runner tells one pytest process to run (`logs/<group>.plan.json`).

The runner writes it and the plugin (`-p torchmatrix.ranks.plugin`) reads it in another process, so
both use this one definition; a plan of another format version is refused with what to do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torchmatrix import file_writes
from torchmatrix.components.optional import OptionalWhere
from torchmatrix.env.devices import Environment
from torchmatrix.json_records import JsonRecord, from_json, json_field, plain
from torchmatrix.matrix.builtin_suites import options_class
from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.suite_options import SuiteOptions
from torchmatrix.messages.compile_store import CompileStore

FORMAT_VERSION = 2


class GroupPlanError(ValueError):
    """A group plan this plugin cannot read; the message names the file."""


def _options_json(options: SuiteOptions | dict) -> dict:
    return plain(options.to_table() if isinstance(options, SuiteOptions) else options)


@dataclass(frozen=True)
class SuiteSpec(JsonRecord):
    """What a process needs to know of a suite: where its tests are, their deadline, its options.

    A built-in suite's options cross as the fields they set with their class's name under `options_type`,
    and are read back into it; a suite of the user's own keeps its table as written (no `options_type`).
    """

    path: str
    timeout: float
    options: SuiteOptions | dict = field(metadata=json_field(dump=_options_json, load=dict))

    def to_json(self) -> dict:
        data = super().to_json()
        if isinstance(self.options, SuiteOptions):
            data["options_type"] = type(self.options).__name__
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SuiteSpec:
        data = dict(data)
        declared = data.pop("options_type", None)
        spec = from_json(cls, data)
        if declared is None:
            return spec
        return replace(spec, options=options_class(declared).from_table(spec.options))


def _runs_json(runs: tuple[tuple[str, Cell], ...]) -> list[dict]:
    return [{"suite": suite, "cell": dict(cell)} for suite, cell in runs]


def _runs_read(runs: list[dict]) -> tuple[tuple[str, Cell], ...]:
    return tuple((run["suite"], Cell(run["cell"])) for run in runs)


@dataclass(frozen=True)
class GroupPlan(JsonRecord):
    """One group's share of the matrix: its world size, suites, the (suite, cell) runs in order,
    and where its events, gate and ranks come from.

    `launched` is True when an external launcher (torchrun, srun) starts one pytest per rank;
    `only_tests` maps a run key to the tests it keeps of that run (`--test`'s, or the one a
    confirmation process re-runs; a function name keeps every parametrization), absent: all;
    `optional` is matrix.toml's `[optional]`: where each component named there may lack its packages;
    `known_failures` maps a run key to the (test glob, reason) pairs of `[[known_failure]]` covering it;
    `compile_store` is where compiled graphs are cached across runs, None to compile cold in the run's directory.
    """

    json_header = {"format_version": FORMAT_VERSION}

    torch: str
    world_size: int
    device: Environment
    events: str
    gate: str | None
    launched: bool
    components: dict
    optional: dict[str, OptionalWhere]
    suites: dict[str, SuiteSpec]
    runs: tuple[tuple[str, Cell], ...] = field(metadata=json_field(dump=_runs_json, load=_runs_read))
    output_cap: int
    only_tests: dict[str, tuple[str, ...]]
    known_failures: dict[str, tuple[tuple[str, str], ...]]
    compile_store: CompileStore | None = None

    @property
    def device_type(self) -> str:
        """`cpu` or `cuda`, as the runner's probe named the ranks' device."""
        return self.device.device_type

    @property
    def deadline(self) -> float:
        """The longest per-test deadline of the group's suites (the process group's timeout derives from it)."""
        return max(spec.timeout for spec in self.suites.values())

    def write(self, path: Path) -> None:
        file_writes.write_text(path, json.dumps(self.to_json(), indent=2))

    @classmethod
    def read(cls, path: Path) -> GroupPlan:
        """The plan at `path`; one written by another torchmatrix version is refused, naming the file."""
        data = json.loads(Path(path).read_text())
        if data.get("format_version") != FORMAT_VERSION:
            raise GroupPlanError(
                f"{path} is a group plan of format {data.get('format_version')!r}, not {FORMAT_VERSION}: "
                "the runner and the plugin come from different torchmatrix installs; reinstall torchmatrix in this venv"
            )
        try:
            return cls.from_json(data)
        except (KeyError, TypeError, ValueError) as error:
            raise GroupPlanError(f"{path}: not a group plan this torchmatrix wrote ({error!r})") from None
