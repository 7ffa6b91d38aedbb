"""Choosing which cells a run covers: `--only axis=values`, `-k EXPR` on ids, `--shard i/n`."""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from torchmatrix.json_records import json_field
from torchmatrix.matrix.cells import Cell, filter_token
from torchmatrix.user_error import UserError


class SelectionError(UserError, ValueError):
    """A filter the user typed that cannot be applied; the message says how to write it."""


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`, 1-based, as written on the command line (`--shard 2/4`)."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
        if not match:
            raise SelectionError(f"--shard {text!r}: write it as i/n, e.g. --shard 2/4")
        index, count = int(match.group(1)), int(match.group(2))
        if count < 1 or not 1 <= index <= count:
            raise SelectionError(f"--shard {text!r}: i must be between 1 and n, e.g. --shard 1/{max(count, 1)}")
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def _only_json(only: Mapping[str, frozenset[str]]) -> dict[str, list[str]]:
    return {axis: sorted(values) for axis, values in only.items()}


def _shard_read(text: str | None) -> Shard | None:
    return None if text is None else Shard.parse(text)


@dataclass(frozen=True)
class CellSelection:
    """The cells a command covers (`--only`, `-k`, `--shard`), parsed once from the command line and
    passed down whole; the fan-out jobs and `torchmatrix run` steps get it back as arguments, and
    plan.json records it (`only` as sorted lists, `shard` as `i/n`)."""

    only: Mapping[str, frozenset[str]] = field(default_factory=dict, metadata=json_field(dump=_only_json))
    """axis -> the accepted spellings (AND across axes); read-only."""
    keyword: str | None = None
    """a `-k` expression over cell ids."""
    shard: Shard | None = field(
        default=None, metadata=json_field(dump=lambda shard: shard and str(shard), load=_shard_read)
    )
    """the slice of what `only` and `keyword` keep."""

    def __post_init__(self) -> None:
        frozen = MappingProxyType({axis: frozenset(values) for axis, values in self.only.items()})
        object.__setattr__(self, "only", frozen)

    @classmethod
    def parse(
        cls, only: Sequence[str], keyword: str | None, shard: str | None, axes: Mapping[str, Sequence]
    ) -> CellSelection:
        """The selection the flags spell, checked against the matrix's axes."""
        return cls(parse_only(only, axes), keyword, Shard.parse(shard) if shard else None)

    @classmethod
    def exactly(cls, cells: Iterable[Cell], among: Iterable[Cell]) -> CellSelection:
        """The selection of these cells out of `among`: a `-k` of their ids, each excluding the other
        ids of `among` that contain it (ws1-none-sdpa-adamw is inside ws1-none-sdpa-adamw-aot_eager)."""
        chosen = [cell.id for cell in cells]
        chosen_ids = frozenset(chosen)
        others = [cell.id for cell in among if cell.id not in chosen_ids]
        terms = []
        for cell_id in chosen:
            longer = [other for other in others if cell_id in other]
            terms.append(" and ".join([cell_id, *(f"not {other}" for other in longer)]))
        return cls(keyword=" or ".join(f"({term})" if " " in term else term for term in terms))

    @property
    def narrows(self) -> bool:
        """Whether `--only` or `-k` is given (a shard slices, it does not narrow)."""
        return bool(self.only or self.keyword)

    def sharded(self, shard: Shard | None) -> CellSelection:
        """The same filters, taking `shard` of what they keep."""
        return dataclasses.replace(self, shard=shard)

    def arguments(self) -> list[str]:
        """The flags that select the same cells, for a job or step to pass on to `torchmatrix run`."""
        only = [f"--only={axis}={','.join(sorted(values, key=_natural))}" for axis, values in self.only.items()]
        keyword = ["-k", self.keyword] if self.keyword else []
        return [*only, *keyword, *(["--shard", str(self.shard)] if self.shard else [])]


EVERY_CELL = CellSelection()
"""No filter: every cell of the matrix."""


def parse_only(filters: Sequence[str], axes: Mapping[str, Sequence]) -> dict[str, set[str]]:
    """Parse repeated `--only axis=v1,v2` into axis -> accepted spellings (AND across axes)."""
    accepted: dict[str, set[str]] = {}
    for text in filters:
        axis, sep, values = text.partition("=")
        axis = axis.strip()
        if not sep or not axis or not values.strip():
            raise SelectionError(f"--only {text!r}: write it as axis=value[,value...], e.g. --only fsdp=fsdp2")
        if axis not in axes:
            raise SelectionError(f"--only {text!r}: {axis!r} is not an axis; use one of: {', '.join(axes)}")
        wanted = {v.strip() for v in values.split(",") if v.strip()}
        accepted[axis] = accepted[axis] & wanted if axis in accepted else wanted
    return accepted


def select_cells(
    cells: Sequence[Cell],
    *,
    only: Mapping[str, set[str]] | None = None,
    keyword: str | None = None,
    shard: Shard | None = None,
) -> list[Cell]:
    """Apply the filters, then take the shard: shards partition exactly what the filters kept.

    `--only` or `-k` that keep no cell is a typo, not an empty run: it raises, naming what exists.
    (A shard may be empty: more shards than cells.)
    """
    chosen = [c for c in cells if passes_only(c, only)] if only else list(cells)
    if cells and only and not chosen:
        raise SelectionError(_nothing_for_only(cells, only))
    if keyword:
        expression = KeywordExpression(keyword)
        kept = [c for c in chosen if expression.matches(c.id)]
        if chosen and not kept:
            examples = ", ".join(c.id for c in chosen[:3]) + (", ..." if len(chosen) > 3 else "")
            raise SelectionError(
                f"-k {keyword!r} matches none of the {len(chosen)} cell ids the other filters kept ({examples}); run `python -m torchmatrix list` to see them"
            )
        chosen = kept
    if shard:
        chosen = shard_cells(chosen, shard)
    return chosen


def _nothing_for_only(cells: Sequence[Cell], only: Mapping[str, set[str]]) -> str:
    """Which `--only` value matched no cell, with the values that axis has."""
    for axis, wanted in only.items():
        existing = sorted({filter_token(c[axis]) for c in cells if axis in c}, key=_natural)
        if not wanted & set(existing):
            return f"--only {axis}={','.join(sorted(wanted, key=_natural))} selects no cell; {axis} has: {', '.join(existing)}"
    written = " ".join(f"--only {axis}={','.join(sorted(values, key=_natural))}" for axis, values in only.items())
    return f"{written}: each value exists, but no cell has them together; run `python -m torchmatrix list` to see the cells"


def _natural(text: str) -> tuple:
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


def passes_only(cell: Cell, only: Mapping[str, set[str]]) -> bool:
    """Whether `cell` has one of the accepted spellings on every axis `--only` names."""
    return all(axis in cell and filter_token(cell[axis]) in values for axis, values in only.items())


def shard_cells(cells: Sequence[Cell], shard: Shard) -> list[Cell]:
    """Contiguous, balanced (sizes differ by at most one) slices of the cells sorted by world size.

    Keeping a world size together means a shard starts few rank pools and needs few GPUs.
    """
    ordered = sorted(cells, key=lambda c: c.world_size)
    base, extra = divmod(len(ordered), shard.count)
    start = (shard.index - 1) * base + min(shard.index - 1, extra)
    size = base + (1 if shard.index <= extra else 0)
    chosen = set(ordered[start : start + size])
    return [c for c in cells if c in chosen]


class KeywordExpression:
    """`-k` expressions over cell ids: words match as substrings, combined with and/or/not/()."""

    TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")

    def __init__(self, text: str):
        self.text = text
        self.tokens = self.TOKEN.findall(text)
        if not self.tokens:
            raise SelectionError("-k: empty expression; write e.g. -k 'fsdp2 and not ws4'")
        self._check()

    def matches(self, cell_id: str) -> bool:
        self._pos = 0
        return self._or(cell_id)

    def _check(self) -> None:
        self._pos = 0
        try:
            self._or("")
        except IndexError:
            raise SelectionError(f"-k {self.text!r}: the expression ends too early") from None
        if self._pos != len(self.tokens):
            raise SelectionError(f"-k {self.text!r}: unexpected {self.tokens[self._pos]!r}")

    def _or(self, cell_id: str) -> bool:
        return self._joined("or", self._and, operator.or_, cell_id)

    def _and(self, cell_id: str) -> bool:
        return self._joined("and", self._not, operator.and_, cell_id)

    def _joined(self, word: str, operand, join, cell_id: str) -> bool:
        """Operands joined by `word`: each is parsed whatever the ones before gave, so that the position moves past it."""
        result = operand(cell_id)
        while self._peek() == word:
            self._pos += 1
            result = join(operand(cell_id), result)
        return result

    def _not(self, cell_id: str) -> bool:
        if self._peek() == "not":
            self._pos += 1
            return not self._not(cell_id)
        return self._atom(cell_id)

    def _atom(self, cell_id: str) -> bool:
        token = self.tokens[self._pos]
        self._pos += 1
        if token == "(":
            result = self._or(cell_id)
            if self._peek() != ")":
                raise SelectionError(f"-k {self.text!r}: missing ')'")
            self._pos += 1
            return result
        if token in ("and", "or", ")"):
            raise SelectionError(f"-k {self.text!r}: unexpected {token!r}")
        return token in cell_id

    def _peek(self) -> str | None:
        return self.tokens[self._pos] if self._pos < len(self.tokens) else None
