"""A KV cache as the grad-ckpt suite reads it: any pytree of tensors and plain values (dicts, lists,
tuples, dataclasses, objects such as transformers' ``DynamicCache``), flattened by path, and which of
its tensors were written between two moments."""

from __future__ import annotations

import types
from collections.abc import Mapping

import torch
from torch import nn

CACHE_STATE_DEPTH = 6
OPAQUE = (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType, nn.Module)


def cache_contents(caches: dict) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    """The caches (name -> any pytree: dicts, lists, tuples, dataclasses, objects such as transformers'
    ``DynamicCache``) flattened to their tensors and their non-tensor state (int counters, lengths,
    flags), each by path: ``past_key_values[0][1]``, ``cache[0]['key_states']``,
    ``len(past_key_values.layers)``. A container reachable by two paths is walked under the first."""
    tensors: dict[str, torch.Tensor] = {}
    state: dict[str, object] = {}
    seen: set[int] = set()

    def walk(value, path: str, depth: int) -> None:
        if isinstance(value, (int, float, bool, str, type(None))):
            state[path] = value
        elif isinstance(value, (torch.dtype, torch.device)):
            state[path] = str(value)
        elif isinstance(value, torch.Tensor):
            tensors[path] = value
        elif isinstance(value, OPAQUE) or depth > CACHE_STATE_DEPTH or id(value) in seen:
            return
        else:
            seen.add(id(value))
            if isinstance(value, (list, tuple, Mapping)):
                state[f"len({path})"] = len(value)
            if isinstance(value, (list, tuple)):
                for index, item in enumerate(value):
                    walk(item, f"{path}[{index}]", depth + 1)
            elif isinstance(value, Mapping):
                for key, item in value.items():
                    walk(item, f"{path}[{key!r}]", depth + 1)
            if hasattr(value, "__dict__"):
                for name, item in vars(value).items():
                    walk(item, f"{path}.{name}", depth + 1)

    for name, cache in caches.items():
        walk(cache, name, 0)
    return tensors, state


def cache_snapshot(caches: dict) -> dict:
    """Every cache tensor by path, copied."""
    return {name: tensor.detach().clone() for name, tensor in cache_contents(caches)[0].items()}


def cache_marks(caches: dict) -> dict[str, tuple[torch.Tensor, int]]:
    """Each cache tensor by path with its version counter, holding the tensor so its identity stays its own."""
    return {name: (tensor, tensor._version) for name, tensor in cache_contents(caches)[0].items()}


def cache_writes(before: dict[str, tuple[torch.Tensor, int]], caches: dict) -> list[str]:
    """The cache tensors written since ``before`` was marked: replaced, written in place, added or removed."""
    after = cache_marks(caches)
    return sorted(
        name
        for name in before.keys() | after.keys()
        if name not in before
        or name not in after
        or after[name][0] is not before[name][0]
        or after[name][1] != before[name][1]
    )
