"""Names of parameters, buffers and modules as the model the `model` component built spells them,
read through whatever wrappers `parallelize` put around it (FSDP1, checkpoint wrappers, compile,
a trainer's own module such as Fabric's `_forward_module`) by module identity, with no list of
wrapper prefixes: the modules the user built survive inside any wrapper, so each name is the
built name of the innermost built module on its path plus what lies below it."""

from __future__ import annotations

import weakref

from torch import nn

from torchmatrix.testing import name_below_wrappers

_BUILT_NAMES: weakref.WeakKeyDictionary[nn.Module, dict[int, str]] = weakref.WeakKeyDictionary()


def module_names(model: nn.Module) -> dict[int, str]:
    """id(module) -> name of every module of `model` as it stands now: what `remember_built` keeps."""
    return {id(module): name for name, module in model.named_modules()}


def remember_built(wrapped: nn.Module, built: dict[int, str]) -> nn.Module:
    """Record `built` (`module_names` of the model before it was wrapped) for `wrapped`; returns `wrapped`."""
    _BUILT_NAMES[wrapped] = built
    return wrapped


def name_as_built(model: nn.Module, name: str) -> str:
    """`name` (a dotted path in `model`) as the built model spells it: the built name of the deepest
    built module on the path, then the rest of the path below it. A model the suites never saw
    built keeps its own names, stripped of the usual wrapper prefixes."""
    built = _BUILT_NAMES.get(model)
    if built is None:
        return name_below_wrappers(model, name)
    parts = name.split(".") if name else []
    module, known, rest = model, built.get(id(model)), 0
    for index, part in enumerate(parts):
        module = getattr(module, "_modules", {}).get(part)
        if module is None:
            break
        if id(module) in built:
            known, rest = built[id(module)], index + 1
    if known is None:
        return name_below_wrappers(model, name)
    return ".".join(part for part in (known, *parts[rest:]) if part)


def named_parameters_as_built(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """`model.named_parameters()` with each name as the built model spells it."""
    return [(name_as_built(model, name), param) for name, param in model.named_parameters()]


def named_buffers_as_built(model: nn.Module) -> list[tuple[str, object]]:
    """`model.named_buffers()` with each name as the built model spells it."""
    return [(name_as_built(model, name), buffer) for name, buffer in model.named_buffers()]


def named_modules_as_built(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """`model.named_modules()` with each name as the built model spells it (a wrapper is named after the slot it fills)."""
    return [(name_as_built(model, name), module) for name, module in model.named_modules()]
