"""What the suites use of the object an `optimizer_<value>` factory returns.

An optimizer-like object that lacks one of these (a container of optimizers without `.state`,
param groups without `lr`) would fail every resume and dtensor_optim cell minutes in, one
traceback each; the pre-run component check builds one on a dummy parameter and asks this.
"""

from __future__ import annotations

from collections.abc import Mapping

METHODS = ("step", "zero_grad", "state_dict", "load_state_dict")


def optimizer_like_problems(optimizer) -> list[str]:
    """One `<what it lacks> (<what the suites do with it>); <fix>` line per thing `optimizer` lacks."""
    lacks = []
    if not isinstance(getattr(optimizer, "state", None), Mapping):
        lacks.append("a `.state` mapping (the suites read optimizer.state[param])")
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, list) or not all(isinstance(group, dict) for group in groups):
        lacks.append("`.param_groups`, a list of dicts (the suites save, load and compare them)")
    elif not all("lr" in group for group in groups):
        lacks.append("`lr` in each of its param_groups (the suites' LR scheduler sets it)")
    missing = [name for name in METHODS if not callable(getattr(optimizer, name, None))]
    if missing:
        lacks.append(f"the method{'s' * (len(missing) > 1)} {', '.join(missing)} (the suites call them)")
    kind = type(optimizer).__name__
    return [
        f"what it returns ({kind}) lacks {what}; return a torch.optim.Optimizer, or an object with it" for what in lacks
    ]
