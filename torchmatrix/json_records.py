"""Dataclasses as JSON, derived from their fields and type hints: how every record that crosses a
process or outlives a run (plan.json, group plans, grants, the event log, results.json) is written
and read, so the writer and the reader agree by construction.

- A field is written under its name, its value by its kind: a nested record as an object, tuples
  and lists as arrays, mappings as objects, an enum as its value, a path as text.
- It is read back by its type hint: `tuple[str, ...]`, `dict[str, X]`, `X | None`, a nested record;
  an enum is passed as read, for the record's `__post_init__` to parse with its own words; a class
  that is neither (a `Cell`, a `Path`) is built from the value; a null where the hint allows none
  reads as the field's default.
- Where a key or a value differs, the field declares it: `field(metadata=json_field(...))`.
- A versioned format's key (`{"format_version": 2}`) leads the object (`JsonRecord.json_header`)
  and is skipped when read: the file's reader checks it, with what to do.
- A class whose JSON keeps another shape writes and reads it with its own `to_json`/`from_json`.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Mapping
from enum import Enum
from pathlib import PurePath
from typing import Any, ClassVar

METADATA_KEY = "json"


@dataclasses.dataclass(frozen=True)
class JsonField:
    """How one field differs from its derived JSON form."""

    key: str | None = None
    """Its JSON key, where that is not the field's name."""
    dump: Callable[[Any], Any] | None = None
    """Its value's JSON form, where that is not the derived one."""
    load: Callable[[Any], Any] | None = None
    """Its value read back from `dump`'s form."""
    omit_empty: bool = False
    """Leave the key out while the value is empty ("", None, 0, an empty collection)."""
    inline: bool = False
    """Write a nested record's keys into this object instead of under its own key."""
    then: Mapping[str, Callable[[Any], Any]] = dataclasses.field(default_factory=dict)
    """Keys computed from the whole record, written right after this field (never read back)."""


PLAIN = JsonField()


def json_field(**declared: Any) -> dict[str, JsonField]:
    """A field's metadata that declares how its JSON differs: `field(metadata=json_field(key="device"))`."""
    return {METADATA_KEY: JsonField(**declared)}


class JsonRecord:
    """A dataclass written and read as its derived JSON; `json_header` leads the object (a format's
    version) and is skipped when read, and a record of a file that outlives its run may ignore keys
    it does not know (`ignores_unknown_keys`), where any other refuses them as its constructor does."""

    json_header: ClassVar[Mapping[str, Any]] = {}
    ignores_unknown_keys: ClassVar[bool] = False

    def to_json(self) -> dict:
        return {**self.json_header, **to_json(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]):
        return from_json(cls, data)


def to_json(record: Any) -> dict:
    """The JSON object of a dataclass instance, field by field in their order."""
    data: dict[str, Any] = {}
    for name, key, form in _writers(type(record)):
        value = getattr(record, name)
        if form.inline:
            data.update(to_json(value))
        elif value or not form.omit_empty:
            data[key] = form.dump(value) if form.dump else plain(value)
        for computed, compute in form.then.items():
            data[computed] = plain(compute(record))
    return data


def plain(value: Any) -> Any:
    """`value` as JSON's types: records as objects, tuples as lists, enums as their values, paths as text."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, Enum):
        return value.value
    if hasattr(value, "to_json"):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json(value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def from_json(cls: type, data: Mapping[str, Any], *, forgiving: bool = False) -> Any:
    """An instance of dataclass `cls` from its JSON object; a missing key, a key it does not know
    (unless it ignores them) and a value of the wrong shape raise TypeError, KeyError or ValueError.
    `forgiving` reads a value of the wrong kind as absent and ignores unknown keys (a file from
    another machine or version)."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__} is read from a JSON object, not {data!r}")
    values: dict[str, Any] = {}
    for read in _readers(cls):
        if read.inline:
            values[read.name] = from_json(read.hint, {key: data[key] for key in _keys(read.hint) if key in data})
            continue
        if read.key not in data:
            continue
        value = data[read.key]
        if (value is None and read.none_is_default) or (forgiving and not _fits(read.hint, value)):
            continue
        values[read.name] = read.load(value) if read.load else typed(read.hint, value)
    if not (forgiving or getattr(cls, "ignores_unknown_keys", False)):
        unknown = {key: value for key, value in data.items() if key not in _keys(cls)}
        renamed = sorted(unknown.keys() & {read.name for read in _readers(cls)})
        if renamed:  # a field's name where its JSON key differs: the constructor would take it
            raise TypeError(f"{cls.__name__} has no key {renamed[0]!r}")
        values.update(unknown)  # the constructor refuses them, naming the first
    return cls(**values)


class _Reader(typing.NamedTuple):
    """How one init field of a record is read: from which key, as which hint."""

    name: str
    key: str
    hint: Any
    load: Callable[[Any], Any] | None
    none_is_default: bool
    inline: bool


@functools.cache
def _readers(cls: type) -> tuple[_Reader, ...]:
    """The readers of `cls`'s fields, made once per class (event logs are read line by line, often)."""
    hints = typing.get_type_hints(cls)
    return tuple(
        _Reader(
            field.name,
            form.key or field.name,
            hints[field.name],
            form.load,
            _has_default(field) and not _allows_none(hints[field.name]),
            form.inline,
        )
        for field, form in _forms(cls)
        if field.init
    )


@functools.cache
def _keys(cls: type) -> frozenset[str]:
    """Every key `cls`'s JSON may hold: its header, its fields', those it computes and those of inlined records."""
    keys = set(getattr(cls, "json_header", ()))
    for field, form in _forms(cls):
        keys.update(form.then)
        keys.update(_keys(typing.get_type_hints(cls)[field.name]) if form.inline else {form.key or field.name})
    return frozenset(keys)


def typed(hint: Any, value: Any) -> Any:
    """A JSON value as the type `hint` names (see the module docstring for what each kind becomes)."""
    if hint in _AS_READ:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        return typed(next(arg for arg in args if arg is not type(None)), value)
    if origin in (tuple, list) and not isinstance(value, (list, tuple)):
        raise TypeError(f"{value!r} is not a JSON array")
    if origin is dict and not isinstance(value, Mapping):
        raise TypeError(f"{value!r} is not a JSON object")
    if origin is tuple and args and args[-1] is Ellipsis:
        return tuple(typed(args[0], item) for item in value)
    if origin is tuple:
        if len(value) != len(args):
            raise ValueError(f"{value!r} is not {len(args)} values")
        return tuple(typed(arg, item) for arg, item in zip(args, value))
    if origin is list:
        return [typed(args[0], item) for item in value]
    if origin is dict:
        return {key: typed(args[1], item) for key, item in value.items()}
    if origin is not None or _is_enum(hint):
        return value
    if hasattr(hint, "from_json"):
        return hint.from_json(value)
    if dataclasses.is_dataclass(hint):
        return from_json(hint, value)
    return hint(value)


_SCALARS = frozenset({str, int, float, bool, type(None)})
_AS_READ = frozenset({Any, str, int, float, bool, dict, list, tuple})
"""Hints whose JSON value is the value itself (a bare `dict` holds whatever the writer put in it)."""


@functools.cache
def _writers(cls: type) -> tuple[tuple[str, str, JsonField], ...]:
    """(field name, JSON key, form) of each field of `cls`, made once per class."""
    return tuple((field.name, form.key or field.name, form) for field, form in _forms(cls))


@functools.cache
def _forms(cls: type) -> tuple[tuple[dataclasses.Field, JsonField], ...]:
    """Each field of dataclass `cls` with its declared form (computed once per class: event logs are read often)."""
    return tuple((field, field.metadata.get(METADATA_KEY, PLAIN)) for field in dataclasses.fields(cls))


def _has_default(field: dataclasses.Field) -> bool:
    return field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING


def _allows_none(hint: Any) -> bool:
    return hint is Any or type(None) in typing.get_args(hint)


def _fits(hint: Any, value: Any) -> bool:
    """Whether `value` is of the scalar kind `hint` names (a bool is no number); other hints fit anything."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_fits(arg, value) for arg in typing.get_args(hint))
    if hint in (int, float):
        return isinstance(value, int if hint is int else (int, float)) and not isinstance(value, bool)
    if hint in (str, bool, type(None)):
        return isinstance(value, hint)
    return True


def _is_enum(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, Enum)
