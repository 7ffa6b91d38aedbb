"""State a model keeps outside its modules' tensors and plain attributes, which grad_ckpt compares too:
objects of the user's own classes reachable from a module (a dataclass of routing statistics on a
layer), and the containers at module level of the Python modules that define the model's classes (a
registry the layer bodies add to, Megatron's aux-loss tracker pattern).

Objects of torch's and the standard library's classes are left out (process groups, meshes, compile
contexts, loggers: the same in both runs, not the model's). The module-level containers are one
object per process, shared by the runs the suite compares, so each run puts them back as it found them."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable

from torch import nn

FOREIGN_PACKAGES = frozenset(sys.stdlib_module_names) | {"torch", "builtins", "numpy"}
"""Top-level packages whose objects are not the model's state: torch, numpy and the standard library."""
MUTABLE_CONTAINERS = (dict, list, set)


def is_user_object(value) -> bool:
    """Whether `value` is an instance of a class of the user's code (a dataclass or plain object with
    attributes), not of torch, numpy or the standard library, and not a module, class or function."""
    kind = type(value)
    return (
        hasattr(value, "__dict__")
        and not isinstance(value, (type, nn.Module))
        and kind.__module__.split(".")[0] not in FOREIGN_PACKAGES
        and not callable(value)
    )


def stored_as_read(value: object) -> bool:
    """A dict, list or set whose items read back as they are stored: a subclass that computes its items
    on access (transformers' `ACT2FN` builds a module per lookup) is a factory, not state, and copying
    or comparing it would call that code."""
    if isinstance(value, dict):
        return type(value).__getitem__ is dict.__getitem__
    if isinstance(value, list):
        return type(value).__getitem__ is list.__getitem__
    return isinstance(value, MUTABLE_CONTAINERS)


def module_level_containers(model: nn.Module, ignored: tuple[str, ...] = ()) -> dict[str, object]:
    """Per path `<python module>.<global name>`, the mutable containers (dicts, lists, sets) and user
    objects kept at module level by the Python modules that define the classes of `model`'s modules
    and their bases (FSDP2 swaps each module's class for a subclass it makes), torch's and the
    standard library's left out, as are dunder names and the names in `ignored`."""
    sources = {kind.__module__ for module in model.modules() for kind in type(module).__mro__}
    found = {}
    for source in sorted(sources):
        python_module = sys.modules.get(source)
        if python_module is None or source.split(".")[0] in FOREIGN_PACKAGES:
            continue
        for name, value in vars(python_module).items():
            if name.startswith("__") or name in ignored:
                continue
            if stored_as_read(value) if isinstance(value, MUTABLE_CONTAINERS) else is_user_object(value):
                found[f"{source}.{name}"] = value
    return found


def kept_as_they_are(containers: dict[str, object]) -> Callable[[], None]:
    """A function that puts each of `containers` back in place as it is now (same object, same
    contents), so the next run the suite compares starts from what this one found. A container that
    cannot be copied (it holds a tensor of an autograd graph) is left as the run leaves it."""
    kept = {}
    for path, container in containers.items():
        try:
            kept[path] = (container, copy.deepcopy(container))
        except Exception:
            continue

    def put_back() -> None:
        for container, contents in kept.values():
            if isinstance(container, dict):
                container.clear()
                container.update(contents)
            elif isinstance(container, list):
                container[:] = contents
            elif isinstance(container, set):
                container.clear()
                container.update(contents)
            else:
                vars(container).clear()
                vars(container).update(vars(contents))

    return put_back
