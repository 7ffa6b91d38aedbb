"""Dataclasses as JSON: the derived form of each kind of field, what a field declares where it differs,
how a malformed object is refused, and that every record of the package can be read back."""

from __future__ import annotations

import importlib
import json
import pkgutil
import typing
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import pytest

import torchmatrix
from torchmatrix import json_records
from torchmatrix.components.optional import OptionalWhere
from torchmatrix.env.devices import Environment
from torchmatrix.json_records import JsonRecord, json_field
from torchmatrix.matrix.cells import Cell
from torchmatrix.messages import events
from torchmatrix.messages.compile_store import CompileStore
from torchmatrix.messages.grant import Grant
from torchmatrix.messages.group_plan import GroupPlan, SuiteSpec
from torchmatrix.messages.run_plan import PlannedSuite, RunPlan


class Colour(str, Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Inner(JsonRecord):
    name: str
    sizes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Limits:
    low: float = 0.0
    high: float = 1.0


@dataclass(frozen=True)
class Outer(JsonRecord):
    json_header = {"format_version": 3}

    inner: Inner
    by_name: dict[str, Inner] = field(default_factory=dict)
    pair: tuple[str, int] | None = None
    colour: Colour = Colour.RED
    where: Path = Path(".")
    cell: Cell = Cell({})
    devices: tuple[str, ...] = field(default=(), metadata=json_field(key="device"))
    ratio: float = field(default=0.0, metadata=json_field(dump=lambda r: str(r), load=float))
    note: str = field(default="", metadata=json_field(omit_empty=True, then={"noted": lambda outer: bool(outer.note)}))
    limits: Limits = field(default_factory=Limits, metadata=json_field(inline=True))

    def __post_init__(self) -> None:
        object.__setattr__(self, "colour", Colour(self.colour))


OUTER = Outer(
    Inner("a", (1, 2)),
    {"b": Inner("b")},
    ("x", 2),
    Colour.BLUE,
    Path("/tmp/run"),
    Cell({"world_size": 2, "fsdp": "fsdp2"}),
    ("cpu",),
    0.5,
    "",
    Limits(0.25, 4.0),
)


def test_a_record_is_written_field_by_field_as_its_fields_declare():
    assert OUTER.to_json() == {
        "format_version": 3,
        "inner": {"name": "a", "sizes": [1, 2]},
        "by_name": {"b": {"name": "b", "sizes": []}},
        "pair": ["x", 2],
        "colour": "blue",
        "where": "/tmp/run",
        "cell": {"world_size": 2, "fsdp": "fsdp2"},
        "device": ["cpu"],
        "ratio": "0.5",
        "noted": False,
        "low": 0.25,
        "high": 4.0,
    }


def test_a_record_reads_back_as_written_through_json():
    for record in (OUTER, Outer(Inner("z"), note="kept")):
        assert Outer.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_a_missing_key_reads_as_the_default_and_a_null_where_the_hint_allows_none_stays_none():
    assert Outer.from_json({"inner": {"name": "a"}, "by_name": None, "pair": None}) == Outer(Inner("a"))


def test_an_unknown_or_missing_key_and_a_wrong_shape_are_refused_as_the_constructor_refuses_them():
    written = OUTER.to_json()
    with pytest.raises(TypeError, match="devices_typo"):
        Outer.from_json({**written, "devices_typo": []})
    with pytest.raises(TypeError, match="Outer has no key 'devices'"):
        Outer.from_json({**written, "devices": ["cpu"]})
    with pytest.raises(TypeError, match="'inner'"):
        Outer.from_json({key: value for key, value in written.items() if key != "inner"})
    with pytest.raises(ValueError, match="is not 2 values"):
        Outer.from_json({**written, "pair": ["x", 2, 3]})
    with pytest.raises(TypeError, match="'x' is not a JSON array"):
        Outer.from_json({**written, "device": "x"})
    with pytest.raises(TypeError, match="'b' is not a JSON object"):
        Outer.from_json({**written, "by_name": "b"})
    with pytest.raises(TypeError, match="Inner is read from a JSON object"):
        Outer.from_json({**written, "inner": "a"})


def test_an_enum_is_passed_as_read_for_the_record_to_parse_with_its_own_words():
    with pytest.raises(ValueError, match="'green' is not a valid Colour"):
        Outer.from_json({**OUTER.to_json(), "colour": "green"})


def test_forgiving_reads_take_a_value_of_the_wrong_kind_as_absent():
    @dataclass(frozen=True)
    class Probed:
        torch: str = ""
        gpu_count: int = 0
        cuda: str | None = None
        ratio: float = 1.0

    read = json_records.from_json(
        Probed, {"torch": 2, "gpu_count": True, "cuda": 12, "ratio": 3, "extra": "x"}, forgiving=True
    )
    assert read == Probed(ratio=3), "a bool is no count, an int is a float, an unknown key is ignored"
    assert json_records.from_json(Probed, {"torch": "2.13.0", "cuda": "13.0"}, forgiving=True) == Probed(
        "2.13.0", cuda="13.0"
    )


def unresolved_hints(classes: list[type]) -> list[str]:
    """`Class: error` for every record whose type hints do not resolve at run time, so it could not be read."""
    problems = []
    for cls in classes:
        try:
            typing.get_type_hints(cls)
        except (NameError, TypeError) as error:
            problems.append(f"{cls.__qualname__}: {error}")
    return problems


def package_records() -> list[type]:
    """Every JsonRecord the torch-free package defines (the suites and models import torch)."""
    for module in pkgutil.walk_packages(torchmatrix.__path__, "torchmatrix."):
        if (
            not module.name.startswith(("torchmatrix.suites", "torchmatrix.models"))
            and module.name != "torchmatrix.__main__"
        ):
            importlib.import_module(module.name)
    found, pending = [], [JsonRecord]
    while pending:
        for subclass in pending.pop().__subclasses__():
            pending.append(subclass)
            if subclass.__module__.startswith("torchmatrix."):
                found.append(subclass)
    return found


def test_every_record_of_the_package_has_type_hints_its_reader_resolves():
    records = package_records()
    assert {"GroupPlan", "RunPlan", "Grant", "TestRecord", "VersionInfo"} <= {cls.__name__ for cls in records}
    assert unresolved_hints(records) == []


def test_a_record_whose_hint_names_a_type_imported_only_for_checkers_is_reported():
    @dataclass(frozen=True)
    class Broken(JsonRecord):
        plan: NotImportedHere  # noqa: F821 - the name a `if TYPE_CHECKING:` import leaves undefined

    assert unresolved_hints([Broken]) == [
        "test_a_record_whose_hint_names_a_type_imported_only_for_checkers_is_reported.<locals>.Broken: name 'NotImportedHere' is not defined"
    ]


ENVIRONMENT_JSON = (
    '{"torch": "2.13.0+cpu", "git_version": "", "cuda_version": null, "gpu_count": 0, "gpu_name": "", '
    '"device": "cpu (ranks simulated as processes, gloo)", "device_type": "cpu", "backend": "gloo", '
    '"python": "/usr/bin/python3"}'
)
# What the hand-written writers wrote before the forms were derived (their bytes, key order included).
CONTRACTS = {
    "grant": '{"gpus": [], "cores": [0, 1], "threads_per_rank": 2, "nice": 19}',
    "plan.json": (
        f'{{"format_version": 1, "torch": "2.13.0", "cells": ["ws2-fsdp2"], "environment": {ENVIRONMENT_JSON}, '
        '"started": null, "matrix": null, "matrix_sha256": null, "baseline": null, "thresholds": {}, "only": {}, '
        '"keyword": null, "shard": null, '
        '"cell_axes": [{"world_size": 2, "fsdp": "fsdp2"}], "suites": {"resume": {"path": "suites/test_resume.py", '
        '"timeout": 300.0, "axes": ["fsdp"]}}, "pool_starts": 0, "finished": false, "missing": [], "merged_from": [], '
        '"load_average": {}}'
    ),
    "group plan": (
        f'{{"format_version": 2, "torch": "2.13.0", "world_size": 2, "device": {ENVIRONMENT_JSON}, "events": "e.jsonl", '
        '"gate": null, "launched": false, "components": {}, "optional": {"model": {"device": ["cpu"], "torch": []}}, '
        '"suites": {"resume": {"path": "suites/test_resume.py", "timeout": 300.0, "options": {}}}, '
        '"runs": [{"suite": "resume", "cell": {"world_size": 2, "fsdp": "fsdp2"}}], "output_cap": 1024, '
        '"only_tests": {"k": ["t"]}, "known_failures": {"k": [["g", "r"]]}, '
        '"compile_store": {"root": "/cache/torchmatrix/compile-cache", "matrix_digest": "0123abcd"}}'
    ),
    "event": (
        '{"event": "test", "suite": "s", "test": "t", "status": "failed", "duration": 1.5, "message": "", "text": "", '
        '"properties": [], "stdout": "", "stderr": "", "confirmation": "", "confirmation_note": "", "nodeid": "n", '
        '"cell": "c"}'
    ),
}


def contract_records() -> dict:
    environment = Environment(torch="2.13.0+cpu", python="/usr/bin/python3")
    cell = Cell({"world_size": 2, "fsdp": "fsdp2"})
    return {
        "grant": Grant.for_group(2, 4, cores=[0, 1], nice=19),
        "plan.json": RunPlan(
            "2.13.0",
            ("ws2-fsdp2",),
            environment,
            cell_axes=(dict(cell),),
            suites={"resume": PlannedSuite("suites/test_resume.py", 300.0, ("fsdp",))},
        ),
        "group plan": GroupPlan(
            "2.13.0",
            2,
            environment,
            "e.jsonl",
            None,
            False,
            {},
            {"model": OptionalWhere(devices=("cpu",))},
            {"resume": SuiteSpec("suites/test_resume.py", 300.0, {})},
            (("resume", cell),),
            1024,
            {"k": ("t",)},
            {"k": (("g", "r"),)},
            CompileStore("/cache/torchmatrix/compile-cache", "0123abcd"),
        ),
        "event": events.TestFinished("s", "t", "failed", 1.5, nodeid="n", cell="c"),
    }


def written(name: str, record) -> str:
    return json.dumps(events.to_json(record) if name == "event" else record.to_json())


def test_the_contract_files_keep_the_bytes_their_hand_written_writers_wrote():
    records = contract_records()
    assert {name: written(name, record) for name, record in records.items()} == CONTRACTS
    assert GroupPlan.from_json(json.loads(CONTRACTS["group plan"])) == records["group plan"]
    assert RunPlan.from_json(json.loads(CONTRACTS["plan.json"])) == records["plan.json"]


def test_a_field_moved_in_its_class_is_caught_by_the_pinned_bytes():
    @dataclass(frozen=True)
    class Reordered(JsonRecord):  # Grant with its fields in another order: the same data, other bytes
        cores: tuple[int, ...] = ()
        gpus: tuple[int, ...] = ()
        threads_per_rank: int = 1
        nice: int = 0

    assert json.dumps(Reordered((0, 1), (), 2, 19).to_json()) != CONTRACTS["grant"]
