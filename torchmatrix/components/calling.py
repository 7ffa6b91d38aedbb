"""How the suites call a component: a keyword the protocol marks optional is passed only where
the factory's signature names it, so a factory written without it keeps working."""

from __future__ import annotations

import inspect

from torchmatrix.components.optimizer_implementations import (
    DEFAULT_IMPLEMENTATION,
    UnavailableImplementation,
    implementation_not_named,
)
from torchmatrix.components.wrapper_chain import name_below_wrappers

NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def accepts(function, keyword: str) -> bool:
    """Whether `function`'s signature names `keyword`; a `**kwargs` catch-all does not count, as it
    may pass the keyword on to something that does not take it."""
    try:
        parameter = inspect.signature(function).parameters.get(keyword)
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in NAMED


def call_accepting(function, *arguments, **keywords):
    """`function(*arguments, **those keywords its signature names)`: a factory written without an
    optional keyword (a scheduler builder without `cell`, a checkpointer without `mesh`) keeps working."""
    return function(*arguments, **{name: value for name, value in keywords.items() if accepts(function, name)})


def is_bound_checkpointer(factory) -> bool:
    """Whether a `checkpointer` component is the bound form, built once with the training objects
    (`Checkpointer(directory, *, model, optimizer, ...)`, then `save(step)` / `load()`), rather than
    a zero-argument factory of an object called with them at every `save` and `load`."""
    return accepts(factory, "model")


def build_optimizer(factory, model, *, implementation: str = DEFAULT_IMPLEMENTATION, **arguments):
    """`factory(model.parameters(), **arguments)`, plus `named_parameters=` (name, param) pairs
    under the names the user's model gives them (components/wrapper_chain.py) where the factory names it, for param groups chosen by name,
    `model=` where it names that, for a stack whose optimizer is built from the model (a container),
    and `implementation=` (the cell's `optimizer_impl`) where it names that. A non-default
    implementation asked of a factory that does not name it raises UnavailableImplementation: it
    would silently run the factory's own choice instead."""
    if accepts(factory, "implementation"):
        arguments["implementation"] = implementation
    elif implementation != DEFAULT_IMPLEMENTATION:
        raise UnavailableImplementation(implementation_not_named(factory, implementation))
    if accepts(factory, "model"):
        arguments["model"] = model
    if accepts(factory, "named_parameters"):
        named = model.named_parameters()
        arguments["named_parameters"] = [(name_below_wrappers(model, name), param) for name, param in named]
    return factory(model.parameters(), **arguments)
