"""What the suites use of the object an `optimizer_<value>` factory returns.

A container of optimizers (torchtitan's `OptimizersContainer`, one optimizer per model part) is
read through the optimizers it holds. An optimizer-like object that lacks one of these (a
container without `.state` or `.optimizers`, param groups without `lr`) would fail every resume and dtensor_optim cell minutes in, one
traceback each; the pre-run component check builds one on a dummy parameter and asks this.
"""

from __future__ import annotations

from collections.abc import Mapping

METHODS = ("step", "zero_grad", "state_dict", "load_state_dict")


def inner_optimizers(optimizer) -> list:
    """The optimizers that hold the per-param state: `optimizer` itself, or, for a container whose own
    `.state` is an empty mapping and that keeps its optimizers in a list `.optimizers` (torchtitan's
    OptimizersContainer, one optimizer per model part), each of those."""
    inner = getattr(optimizer, "optimizers", None)
    state = getattr(optimizer, "state", None)
    if (
        isinstance(inner, (list, tuple))
        and inner
        and isinstance(state, Mapping)
        and not state
        and all(hasattr(part, "state") and hasattr(part, "param_groups") for part in inner)
    ):
        return list(inner)
    return [optimizer]


def optimizer_like_problems(optimizer) -> list[str]:
    """One `<what it lacks> (<what the suites do with it>); <fix>` line per thing `optimizer` lacks;
    a container's state and param groups are those of its inner optimizers."""
    lacks = []
    parts = inner_optimizers(optimizer)
    if not all(isinstance(getattr(part, "state", None), Mapping) for part in parts):
        lacks.append("a `.state` mapping (the suites read optimizer.state[param])")
    groups = [getattr(part, "param_groups", None) for part in parts]
    if not all(isinstance(group, list) and all(isinstance(g, dict) for g in group) for group in groups):
        lacks.append("`.param_groups`, a list of dicts (the suites save, load and compare them)")
    elif not all("lr" in g for group in groups for g in group):
        lacks.append("`lr` in each of its param_groups (the suites' LR scheduler sets it)")
    missing = [name for name in METHODS if not callable(getattr(optimizer, name, None))]
    if missing:
        lacks.append(f"the method{'s' * (len(missing) > 1)} {', '.join(missing)} (the suites call them)")
    kind = type(optimizer).__name__
    return [
        f"what it returns ({kind}) lacks {what}; return a torch.optim.Optimizer, or an object with it" for what in lacks
    ]
