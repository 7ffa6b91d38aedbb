"""Cells: one combination of axis values, and the expansion of axes into cells.

Expansion follows GitHub Actions matrix semantics, so a matrix written for a workflow reads the
same here: exclude matches partially, includes are applied after excludes, an include extends
every original combination it does not contradict and otherwise becomes a new cell.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any


@functools.lru_cache(maxsize=65536, typed=True)  # typed: True and 1 spell differently
def value_token(axis: str, value: Any) -> str:
    """How a value is spelled in cell ids and in `--only` filters."""
    if axis == "world_size":
        return f"ws{value}"
    if isinstance(value, bool):
        return axis if value else f"no_{axis}"
    return str(value)


def filter_token(value: Any) -> str:
    """How a value is spelled on the command line: `--only world_size=2 --only compile=true`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class Cell(Mapping):
    """An immutable mapping axis -> value with a stable, filename-safe id like `ws2-fsdp2-sdpa-adamw`."""

    __slots__ = ("_items", "_values", "_id")

    def __init__(self, items: Mapping[str, Any] | tuple[tuple[str, Any], ...]):
        values = dict(items)
        object.__setattr__(self, "_items", tuple(values.items()))
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_id", None)

    def __setattr__(self, name, value):
        raise AttributeError("Cell is immutable")

    def __getitem__(self, axis: str) -> Any:
        return self._values[axis]

    def __contains__(self, axis: object) -> bool:
        return axis in self._values

    def get(self, axis: str, default: Any = None) -> Any:
        return self._values.get(axis, default)

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cell) and self._items == other._items

    def __reduce__(self):
        return (Cell, (self._items,))

    def __repr__(self) -> str:
        return f"Cell({self.id})"

    @property
    def id(self) -> str:
        if self._id is None:  # computed once: planning 10^5 cells asks for ids many times
            object.__setattr__(self, "_id", "-".join([value_token(axis, value) for axis, value in self._items]))
        return self._id

    @property
    def world_size(self) -> int:
        """Ranks (GPUs) the cell needs; a cell without a world_size axis runs on one."""
        return int(self.get("world_size", 1))


def matches_entry(entry: Mapping[str, Any], combination: Mapping[str, Any]) -> bool:
    """Partial match; a list in an entry ([[exclude]], [[known_failure]]) means any of its values."""
    for axis, wanted in entry.items():
        if axis not in combination:
            return False
        options = wanted if isinstance(wanted, list) else [wanted]
        if not any(value_token(axis, combination[axis]) == value_token(axis, option) for option in options):
            return False
    return True


MAX_CELLS = 200_000
"""The most cells a matrix may expand into (twice the 10^5 that bench/plan_scale.py times, about
0.2 GB of cells); a larger product is refused before expansion unless `--only`/`-k` narrow it."""
MAX_SCANNED = 10 * MAX_CELLS
"""The most cells `-k` reads one at a time from a matrix past MAX_CELLS, after `--only` has pruned
its axes (seconds of work; a product of 10^8 would take hours)."""


def cell_bound(axes: Mapping[str, Sequence[Any]], include: Sequence[Mapping[str, Any]] = ()) -> int:
    """At most how many cells `axes` and `include` expand into, counted without expanding them."""
    return (math.prod(len(values) for values in axes.values()) if axes else 0) + len(include)


def iter_cells(
    axes: Mapping[str, Sequence[Any]],
    exclude: Sequence[Mapping[str, Any]] = (),
    include: Sequence[Mapping[str, Any]] = (),
) -> Iterator[Cell]:
    """The cells one at a time (a filter can then keep a few of a product too large to hold):
    the product, minus excludes, then includes (GitHub Actions rules)."""
    names = list(axes)
    matched = [False] * len(include)
    for values in itertools.product(*(axes[n] for n in names)) if names else ():
        combo = dict(zip(names, values))
        if any(matches_entry(entry, combo) for entry in exclude):
            continue
        additions: dict[str, Any] = {}
        for index, entry in enumerate(include):
            if all(value_token(k, combo[k]) == value_token(k, v) for k, v in entry.items() if k in combo):
                additions.update({k: v for k, v in entry.items() if k not in combo})
                matched[index] = True
        yield Cell(combo) if not additions else _ordered(names, {**combo, **additions})
    for entry, was_matched in zip(include, matched):
        if not was_matched:
            yield _ordered(names, dict(entry))


def expand_cells(
    axes: Mapping[str, Sequence[Any]],
    exclude: Sequence[Mapping[str, Any]] = (),
    include: Sequence[Mapping[str, Any]] = (),
) -> list[Cell]:
    """Expand axes into cells: the product, minus excludes, then includes (GitHub Actions rules)."""
    return list(iter_cells(axes, exclude, include))


def _ordered(names: list[str], values: Mapping[str, Any]) -> Cell:
    """Axis order first (so ids read the same way everywhere), then keys an include added."""
    keys = [n for n in names if n in values] + [k for k in values if k not in names]
    return Cell(tuple((k, values[k]) for k in keys))
