"""The configured components wrapped in generic mutants, one module attribute per `<mutant>__<key>`.

Resolved on first access from the registry entry and the unmutated component's import path in
INNER_COMPONENTS_VARIABLE, so a mutated matrix points here instead of at generated source."""

from __future__ import annotations

import functools
import json
import os

from torchmatrix.sensitivity import mutants
from torchmatrix.sensitivity.registry import INNER_COMPONENTS_VARIABLE, mutant_named


def __getattr__(attribute: str):
    mutant_name, _, key = attribute.partition("__")
    mutant = mutant_named(mutant_name)
    if mutant is None or not key or not mutant.wraps(key):
        raise AttributeError(f"{__name__} has no {attribute!r}: expected <generic mutant>__<component key it wraps>")
    inner = json.loads(os.environ.get(INNER_COMPONENTS_VARIABLE, "{}")).get(key)
    if inner is None:
        raise AttributeError(
            f"{__name__}.{attribute}: {INNER_COMPONENTS_VARIABLE} names no component {key!r}; "
            "only `python -m torchmatrix sensitivity` runs mutated components"
        )
    return wrapped(mutant.name, inner)


@functools.cache
def wrapped(mutant_name: str, inner: str):
    """The component at `inner` in the mutant's wrapper, built once per process (one class, not one per lookup)."""
    mutant = mutant_named(mutant_name)
    return getattr(mutants, mutant.wrapper)(inner, *mutant.wrapper_args)
