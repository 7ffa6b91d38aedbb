"""A failure that only follows from another test's failure in the same cell names that test, so the
reports list it under that root cause instead of as a cause of its own."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

CONSEQUENCE_OF = "consequence_of"
"""The test property naming, comma-separated, the tests of the same suite and cell whose failure this
test's follows from (e.g. `test_state_restored_right_after_load[piece=scheduler]`)."""

T = TypeVar("T")


def consequence_of(tests: list[str]) -> str:
    """The property value naming `tests`."""
    return ", ".join(tests)


def causes_named(value: object) -> tuple[str, ...]:
    """The tests a recorded CONSEQUENCE_OF value names (none where the value is not text)."""
    return tuple(test.strip() for test in value.split(",") if test.strip()) if isinstance(value, str) else ()


def under_their_causes(
    items: Sequence[T], key: Callable[[T], Hashable], causes: Callable[[T], Iterable[Hashable]]
) -> list[tuple[T, list[T]]]:
    """Each item that is a cause, in order, with the items that follow from it.

    An item follows from another when `causes(item)` names that item's `key`; it joins the first
    such cause, through chains. One whose named causes are not among `items`, or only one another
    in a cycle, stands as a cause of its own, so nothing is lost."""
    keys = {key(item) for item in items}
    groups: list[tuple[T, list[T]]] = []
    group_of: dict[Hashable, int] = {}
    pending = []
    for item in items:
        if any(cause in keys and cause != key(item) for cause in causes(item)):
            pending.append(item)
        else:
            group_of[key(item)] = len(groups)
            groups.append((item, []))
    joined = True
    while joined:
        joined = False
        for item in list(pending):
            found = [group_of[cause] for cause in causes(item) if cause in group_of]
            if found:
                groups[found[0]][1].append(item)
                group_of[key(item)] = found[0]
                pending.remove(item)
                joined = True
    groups += [(item, []) for item in pending]
    return groups
