"""Every value a model's modules keep outside their parameters (buffers, attributes, counters, the
containers they hold), walked the same way before and after a step, so grad_ckpt can name the one a
recompute changed."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.tensor import DTensor

from torchmatrix.testing import (
    user_model,
    wrapper_chain,
)

from ..comparison.differences import same_state
from ..recompute.grad_ckpt_precision import EXACT, mismatch
from .built_names import named_buffers_as_built, named_modules_as_built
from .cache_tree import CACHE_STATE_DEPTH, OPAQUE
from .reachable_state import is_user_object, module_level_containers

BODY_CALLS_PROBE = 1_000_003


def local_tensor(tensor):
    """This rank's shard of a DTensor (FSDP2), or the tensor itself (FSDP1 flat-param views, no FSDP)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def buffers(model) -> dict:
    """Every buffer by the model's own name, copied to the CPU (FSDP leaves buffers whole on every rank)."""
    return {n: local_tensor(b).detach().to("cpu", copy=True) for n, b in named_buffers_as_built(model)}


MODULE_INTERNALS = frozenset(vars(nn.Module()))
# What FSDP and torch's composable APIs keep on the modules they wrap: the same in both runs, not the model's.
WRAPPER_ATTRIBUTES = ("__", "_fsdp", "_is_fsdp")
PLAIN_VALUES = (int, float, bool, str, type(None))


@dataclass(frozen=True)
class Entries:
    """A container in a module's state, by its length (its items are compared under their own paths)."""

    count: int

    def __repr__(self) -> str:
        return f"{self.count} entries"


@dataclass(frozen=True)
class Slot:
    """Where a value of a module's state is held: an attribute of an object, or an item of a container."""

    holder: object
    key: object
    attribute: bool

    def get(self):
        return getattr(self.holder, self.key) if self.attribute else self.holder[self.key]

    def set(self, value) -> None:
        if self.attribute:
            object.__setattr__(self.holder, self.key, value)
        else:
            self.holder[self.key] = value


MAX_ITEMS_WALKED = 1000
"""Items of one container the module-state walk enters (its length is compared whatever it is)."""
MAX_STATE_VALUES = 50_000
"""Values the module-state walk records in all: a bound on what one snapshot copies."""


def module_state(model: nn.Module, ignored: tuple[str, ...] = ()) -> tuple[dict[str, object], dict[str, Slot]]:
    """Every module's own attributes that hold tensors, numbers, strings, containers of them or
    objects of the user's classes (a dataclass of routing statistics), by path
    (``prefix_layers.1.aux_losses[0]``, ``prefix_layers.1.stats.tokens``), and the module-level
    containers of the Python modules that define the model's classes
    (``models.moe.AUX_LOSS_TRACKER['layer 1']``, suites/state/reachable_state.py): state a forward may
    append to or bump outside buffers and parameters; and where each int is held, so
    ``body_call_counters`` can find the counters ``body_calls()`` reports. torch's own module
    internals, parameters, submodules, wrapper modules and the names in ``ignored`` are left out;
    an object reached twice is walked once, and the walk is bounded in depth and size."""
    state: dict[str, object] = {}
    ints: dict[str, Slot] = {}
    walked: set[int] = set()

    def walk(value, path: str, depth: int, slot: Slot) -> None:
        if isinstance(value, nn.Parameter) or isinstance(value, OPAQUE) or depth > CACHE_STATE_DEPTH:
            return
        if len(state) >= MAX_STATE_VALUES:
            return
        if not isinstance(value, (*PLAIN_VALUES, torch.Tensor)):
            if id(value) in walked:
                return
            walked.add(id(value))
        if isinstance(value, PLAIN_VALUES):
            state[path] = value
            if type(value) is int:
                ints[path] = slot
        elif isinstance(value, torch.Tensor):
            state[path] = local_tensor(value).detach().to("cpu", copy=True)
        elif isinstance(value, (list, tuple, set, frozenset)):
            state[path] = Entries(len(value))
            items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
            for index, item in enumerate(items[:MAX_ITEMS_WALKED]):
                walk(item, f"{path}[{index}]", depth + 1, Slot(value, index, False))
        elif isinstance(value, dict):
            state[path] = Entries(len(value))
            for key, item in list(value.items())[:MAX_ITEMS_WALKED]:
                walk(item, f"{path}[{key!r}]", depth + 1, Slot(value, key, False))
        elif is_user_object(value):
            for attribute, item in vars(value).items():
                if not attribute.startswith("__") and attribute not in ignored:
                    walk(item, f"{path}.{attribute}", depth + 1, Slot(value, attribute, True))

    wrappers = {id(wrapper) for wrapper in wrapper_chain(model)[:-1]}
    for name, module in named_modules_as_built(model):
        if id(module) in wrappers or isinstance(module, FullyShardedDataParallel):
            continue
        for attribute, value in vars(module).items():
            if attribute in MODULE_INTERNALS or attribute in ignored or attribute.startswith(WRAPPER_ATTRIBUTES):
                continue
            if attribute in module._parameters or attribute in module._modules:
                continue
            path = f"{name}.{attribute}" if name else attribute
            walk(value, path, 0, Slot(module, attribute, True))
    for path, container in module_level_containers(model, ignored).items():
        walk(container, path, 0, Slot(sys.modules[path.rpartition(".")[0]], path.rpartition(".")[2], True))
    return state, ints


def body_call_counters(model: nn.Module, ints: dict[str, Slot]) -> set[str]:
    """The ints that ``body_calls()`` reports, found by moving each one and seeing whether what it
    returns moves: recompute must bump those (and only those), so the attribute check leaves them out."""
    reported = user_model(model).body_calls()
    found = set()
    for path, slot in ints.items():
        try:
            value = slot.get()
            slot.set(value + BODY_CALLS_PROBE)
        except (TypeError, IndexError, KeyError, AttributeError):
            continue
        try:
            if user_model(model).body_calls() != reported:
                found.add(path)
        finally:
            slot.set(value)
    return found


def module_state_problems(
    actual: dict, expected: dict, before: tuple[dict, dict], counters: set[str] = frozenset()
) -> list[str]:
    """One line per attribute path whose value differs between the two runs after backward, or that
    only one has. Left out: paths the two runs already held differently before forward (set up
    differently, e.g. the layers' checkpointing switch), and the ``body_calls()`` counters
    (``counters``), which recompute must bump."""
    set_up_differently = {
        path for path in before[0].keys() | before[1].keys() if not same_state(before[0].get(path), before[1].get(path))
    }
    problems = []
    for path in sorted((actual.keys() | expected.keys()) - set_up_differently - counters):
        if path not in expected:
            problems.append(f"{path}: present with checkpointing only ({actual[path]!r})")
        elif path not in actual:
            problems.append(f"{path}: present without checkpointing only ({expected[path]!r})")
        elif not same_state(actual[path], expected[path]):
            problems.append(f"{path}: {describe_difference(actual[path], expected[path])}")
    return problems


def describe_difference(actual, expected) -> str:
    if isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor):
        return mismatch(actual, expected, EXACT)
    if isinstance(actual, Entries) and isinstance(expected, Entries):
        return f"{actual.count} entries vs {expected.count}"
    return f"{actual!r} vs {expected!r}"
