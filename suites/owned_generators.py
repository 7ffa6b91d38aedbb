"""Random generators a training stack owns besides the global streams: a `torch.Generator` kept on a
module for its dropout, a numpy or Python generator a dataset or loader shuffles with.

A checkpointer that restores only the global streams leaves these where a fresh build put them, so
the resume suite finds them by attribute (also inside the dicts, lists and plain objects the model,
dataset and loader hold, e.g. one generator per device) and checks each by its path.
"""

from __future__ import annotations

import pickle
import random

import torch
from torch import nn

from torchmatrix.testing import clean_name

try:
    import numpy
except ImportError:
    numpy = None

SEARCH_DEPTH = 4
MODULE_INTERNALS = frozenset(vars(nn.Module()))
# What FSDP and torch's composable APIs keep on the modules they wrap: process groups and handles, no generators.
WRAPPER_ATTRIBUTES = ("__", "_fsdp")


def is_generator(value) -> bool:
    kinds = (torch.Generator, random.Random)
    if numpy is not None:
        kinds += (numpy.random.Generator, numpy.random.RandomState)
    return isinstance(value, kinds)


def owned_generators(roots: dict[str, object]) -> dict[str, object]:
    """Every generator reachable from `roots` (name -> model, dataset or loader) by attributes, dict
    values and list items, by path (`model.prefix_layers.0.dropout.generator`, `loader.generators[1]`);
    one path per generator. A module root is searched module by module, so a path names the module."""
    found: dict[str, object] = {}
    seen: set[int] = set()

    def walk(value, path: str, depth: int) -> None:
        if id(value) in seen or depth > SEARCH_DEPTH:
            return
        seen.add(id(value))
        if is_generator(value):
            found[path] = value
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}[{key!r}]", depth + 1)
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(item, f"{path}[{index}]", depth + 1)
        elif isinstance(value, nn.Module):
            return
        elif hasattr(value, "__dict__") and not isinstance(value, (type, torch.Tensor)):
            for name, item in vars(value).items():
                walk(item, f"{path}.{name}", depth + 1)

    for root_name, root in roots.items():
        if isinstance(root, nn.Module):
            for module_name, module in root.named_modules():
                for name, item in vars(module).items():
                    if name not in MODULE_INTERNALS and not name.startswith(WRAPPER_ATTRIBUTES):
                        walk(item, clean_name(".".join(part for part in (root_name, module_name, name) if part)), 1)
        else:
            walk(root, root_name, 0)
    return found


def generator_state(generator) -> object:
    """The generator's state, as its own API returns it (what `set_generator_state` takes back)."""
    if isinstance(generator, torch.Generator):
        return generator.get_state()
    if isinstance(generator, random.Random):
        return generator.getstate()
    if isinstance(generator, numpy.random.Generator):
        return generator.bit_generator.state
    return generator.get_state()


def set_generator_state(generator, state) -> None:
    if isinstance(generator, torch.Generator):
        generator.set_state(state)
    elif isinstance(generator, random.Random):
        generator.setstate(state)
    elif isinstance(generator, numpy.random.Generator):
        generator.bit_generator.state = state
    else:
        generator.set_state(state)


def state_bytes(generator) -> bytes:
    """The generator's state as bytes, so two captures compare with ==."""
    state = generator_state(generator)
    if isinstance(state, torch.Tensor):
        return state.numpy().tobytes()
    return pickle.dumps(state)
