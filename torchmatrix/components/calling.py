"""How the suites call a component: a keyword the protocol marks optional is passed only where
the factory's signature names it, so a factory written without it keeps working."""

from __future__ import annotations

import inspect

from torchmatrix.components.parameter_names import clean_name

NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def accepts(function, keyword: str) -> bool:
    """Whether `function`'s signature names `keyword`; a `**kwargs` catch-all does not count, as it
    may pass the keyword on to something that does not take it."""
    try:
        parameter = inspect.signature(function).parameters.get(keyword)
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in NAMED


def build_optimizer(factory, model, **arguments):
    """`factory(model.parameters(), **arguments)`, plus `named_parameters=` (name, param) pairs
    under their wrapper-free names where the factory names it, for param groups chosen by name."""
    if accepts(factory, "named_parameters"):
        arguments["named_parameters"] = [(clean_name(name), param) for name, param in model.named_parameters()]
    return factory(model.parameters(), **arguments)
