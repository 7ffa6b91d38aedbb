"""The grad-ckpt suite's own view of activation checkpointing: it instruments
``torch.utils.checkpoint.checkpoint`` wherever a loaded module holds it, so recompute is counted
per checkpoint unit (a module, a module's method, or any function) without the model reporting it,
and the mutable containers forward hands to those units (a KV cache kept in a local variable) are
observed: the cache hook."""

from __future__ import annotations

import functools
import inspect
import operator
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import repeat

import torch
import torch.utils.checkpoint
from torch import nn

from ..state.built_names import named_modules_as_built
from ..state.cache_tree import cache_marks

CONTAINER_EXCLUDED = (torch.Tensor, nn.Module, type, tuple, str, bytes)


@dataclass
class Unit:
    """One checkpoint unit as forward called it: how often its function ran in forward and again in backward."""

    function: object
    base: object
    order: int
    forward_runs: int = 0
    reruns: int = 0
    rerun_writes: list = field(default_factory=list)
    """The tensors its reruns put into, or wrote in place in, the containers forward handed to the units."""


@dataclass
class CheckpointUnits:
    """What the instrumented ``checkpoint`` saw during a step: its units, and the containers passed to
    them with their tensors' marks when first passed (``cache_marks``), so writes after it show."""

    units: dict[tuple, Unit] = field(default_factory=dict)
    containers: list[tuple[str, object, dict]] = field(default_factory=list)
    last_rerun: Unit | None = None
    _calls_this_forward: dict[object, int] = field(default_factory=dict)

    def next_forward(self) -> None:
        """A new forward of the model begins: call order restarts, so unit names repeat per forward."""
        self._calls_this_forward.clear()

    def wrap(self, function, args: tuple, kwargs: dict):
        """``function`` counting its runs, its unit noted, the mutable containers among its arguments kept."""
        target = function
        while isinstance(target, functools.partial):  # transformers: partial(layer.__call__, **kwargs)
            args, kwargs = (*target.args, *args), {**target.keywords, **kwargs}
            target = target.func
        target = getattr(target, "_torchdynamo_orig_callable", target)  # torch.compile(layer.body)'s method
        base = target.__self__ if inspect.ismethod(target) else target
        key_base = (id(base), getattr(target, "__name__", None))
        order = self._calls_this_forward.get(key_base, 0)
        self._calls_this_forward[key_base] = order + 1
        unit = self.units.setdefault((key_base, order), Unit(target, base, order))
        self.note_containers(target, args, kwargs)
        ran = [False]

        def counted(*inner_args, **inner_kwargs):
            if not ran[0]:
                ran[0] = True
                unit.forward_runs += 1
                return function(*inner_args, **inner_kwargs)
            unit.reruns += 1
            self.last_rerun = unit
            before = self.container_tensors()
            try:
                return function(*inner_args, **inner_kwargs)
            finally:  # also when checkpoint's early stop ends the recompute by raising
                unit.rerun_writes += [
                    tensor
                    for key, (tensor, version) in self.container_tensors().items()
                    if key not in before or before[key][1] != version
                ]

        return counted

    def note_containers(self, function, args: tuple, kwargs: dict) -> None:
        try:
            bound = inspect.signature(function).bind_partial(*args, **kwargs).arguments
        except (TypeError, ValueError):
            bound = {**{f"argument {index}": value for index, value in enumerate(args)}, **kwargs}
        for name, value in bound.items():
            if not isinstance(value, CONTAINER_EXCLUDED) and (
                isinstance(value, (dict, list)) or hasattr(value, "__dict__")
            ):
                if all(value is not seen for _, seen, _ in self.containers):
                    self.containers.append((name, value, cache_marks({name: value})))

    def container_tensors(self) -> dict[int, tuple[torch.Tensor, int]]:
        """Every tensor in the containers forward handed to the units, by identity, with its version."""
        return {
            id(tensor): (tensor, version)
            for name, container, _ in self.containers
            for tensor, version in cache_marks({name: container}).values()
        }

    def rerun_writers(self, model: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, str]:
        """Path -> the name of the unit whose rerun wrote the tensor at that path of ``tensors`` (a
        cache's, by path), for the tensors some rerun wrote; units are named as ``calls`` names them."""
        names = {id(module): name for name, module in named_modules_as_built(model)}
        writer = {id(tensor): unit_name(unit, names) for unit in self.units.values() for tensor in unit.rerun_writes}
        return {path: writer[id(tensor)] for path, tensor in tensors.items() if id(tensor) in writer}

    def sites(self, model: nn.Module) -> list[tuple[str, str | None]]:
        """Where the units that are modules or modules' methods sit in ``model``: (module path, method
        name, or None for the module's own call), so a run without checkpointing can watch the same calls."""
        names = {id(module): name for name, module in named_modules_as_built(model)}
        found = []
        for unit in self.units.values():
            path, method = names.get(id(unit.base)), getattr(unit.function, "__name__", None)
            if path is not None:
                found.append((path, None if unit.base is unit.function or method in MODULE_CALLS else method))
        return sorted(set(found), key=repr)

    def rerunning(self, model: nn.Module) -> str | None:
        """The name of the unit whose function backward ran again last (the one a recompute error
        comes from), or None when none ran again."""
        if self.last_rerun is None:
            return None
        names = {id(module): name for name, module in named_modules_as_built(model)}
        return f"checkpoint unit {unit_name(self.last_rerun, names)}"

    def calls(self, model: nn.Module) -> dict[str, int]:
        """Unit name -> how often its function ran, in forward and again in backward.
        A unit is named by its module path (``layers.3``), module path and method (``layers.3._forward``),
        or qualified name (``PrefixSuffix._run_layer``), with ``#n`` (call order in one forward) when
        forward calls it more than once."""
        names = {id(module): name for name, module in named_modules_as_built(model)}
        counts: dict[str, int] = {}
        repeated = {key_base for key_base, order in self.units if order > 0}
        for (key_base, order), unit in self.units.items():
            name = unit_name(unit, names)
            if key_base in repeated:
                name = f"{name}#{order}"
            if name in counts:  # two functions of one qualified name: told apart by when they were first called
                name = f"{name}@{len(counts)}"
            counts[name] = unit.forward_runs + unit.reruns
        return counts


def unit_name(unit: Unit, names: dict[int, str]) -> str:
    """Module path for a module, module path and method name for a bound method of a submodule,
    the qualified name otherwise (a function, a method of the model's root or of a non-module)."""
    path = names.get(id(unit.base))
    function_name = getattr(unit.function, "__name__", None)
    if path and unit.base is not unit.function and function_name not in MODULE_CALLS:
        return f"{path}.{function_name}"
    if path:
        return path
    return getattr(unit.function, "__qualname__", None) or type(unit.function).__qualname__


MODULE_CALLS = frozenset({"__call__", "_wrapped_call_impl", "_call_impl", "forward"})
"""Methods that run the module itself: a unit calling one is named by the module's path alone."""

ORIGINAL_CHECKPOINT = torch.utils.checkpoint.checkpoint


@contextmanager
def watched_sites(model: nn.Module, sites: list[tuple[str, str | None]], seen: CheckpointUnits):
    """Without checkpointing, the units of a checkpointed run are called directly: within the block,
    the containers handed to them at ``sites`` (``CheckpointUnits.sites``) go to ``seen`` as well, so
    the eager run's cache is found by the same hook."""
    modules = {name: module for name, module in named_modules_as_built(model)}
    undo = []
    for path, method in sites:
        module = modules.get(path)
        if module is None:
            continue
        if method is None:
            handle = module.register_forward_pre_hook(
                lambda module, args, kwargs: seen.note_containers(module.forward, args, kwargs), with_kwargs=True
            )
            undo.append(handle.remove)
            continue
        bound = getattr(module, method)

        def watched(*args, bound=bound, **kwargs):
            seen.note_containers(bound, args, kwargs)
            return bound(*args, **kwargs)

        module.__dict__[method] = watched
        undo.append(functools.partial(module.__dict__.pop, method))
    try:
        yield
    finally:
        for step in undo:
            step()


CHECKPOINT_OPTIONS = frozenset(
    {"use_reentrant", "context_fn", "determinism_check", "debug", "preserve_rng_state", "early_stop"}
)
ACTIVE: list[CheckpointUnits] = []
"""The ``CheckpointUnits`` of the block ``counted_checkpoints`` is running, if any."""


def instrumented_checkpoint(function, *args, **kwargs):
    """``torch.utils.checkpoint.checkpoint``, counting into the active ``CheckpointUnits``; outside a
    block (a module imported during one kept this function) the original alone. torch.compile never
    runs it: it traces the call as checkpoint's higher-order op, so a compiled checkpoint goes uncounted."""
    if ACTIVE:
        plain_kwargs = {key: value for key, value in kwargs.items() if key not in CHECKPOINT_OPTIONS}
        function = ACTIVE[-1].wrap(function, args, plain_kwargs)
    return ORIGINAL_CHECKPOINT(function, *args, **kwargs)


# Patched into torch.utils.checkpoint, this is the function torch.compile recognises as checkpoint and
# traces as its higher-order op, splitting checkpoint's own keywords (use_reentrant) from the checkpointed
# function's by this signature: it must be the original's.
instrumented_checkpoint.__signature__ = inspect.signature(ORIGINAL_CHECKPOINT)

KEPT_NAMES = frozenset({"ORIGINAL_CHECKPOINT", "instrumented_checkpoint"})


def modules_holding(function, modules=None) -> list[tuple[object, str]]:
    """(module, attribute) wherever a loaded module (or one of `modules`) holds ``function``: torch's
    own module, its checkpoint wrapper, transformers', the user's ``from torch.utils.checkpoint import
    checkpoint``; not under the names this module (wherever it is loaded from) keeps the two functions by.
    A namespace is searched by identity in C first: each grad_ckpt step searches every loaded module."""
    holders = []
    for module in list(sys.modules.values()) if modules is None else modules:
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and any(map(operator.is_, list(namespace.values()), repeat(function))):
            holders += [
                (module, name)
                for name, value in list(namespace.items())
                if value is function and name not in KEPT_NAMES
            ]
    return holders


@contextmanager
def counted_checkpoints():
    """Within the block, every call of ``torch.utils.checkpoint.checkpoint`` through a loaded module's
    reference counts its unit's runs and notes its containers, in the ``CheckpointUnits`` yielded.
    Leaving it restores the references it replaced and those modules imported during it took; one
    loaded before that took the instrumented function keeps it, which outside a block runs the original."""
    seen = CheckpointUnits()
    loaded = set(sys.modules)
    patched = modules_holding(ORIGINAL_CHECKPOINT)
    for module, name in patched:
        setattr(module, name, instrumented_checkpoint)
    ACTIVE.append(seen)
    try:
        yield seen
    finally:
        ACTIVE.remove(seen)
        if not ACTIVE:
            imported = [module for key, module in list(sys.modules.items()) if key not in loaded]
            for module, name in patched + modules_holding(instrumented_checkpoint, imported):
                if getattr(module, name, None) is instrumented_checkpoint:
                    setattr(module, name, ORIGINAL_CHECKPOINT)
