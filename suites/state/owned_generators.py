"""Random generators a training stack owns besides the global streams: a `torch.Generator` kept on a
module for its dropout, a numpy or Python generator a dataset or loader shuffles with.

A checkpointer that restores only the global streams leaves these where a fresh build put them, so
the resume suite finds them by attribute (also inside the dicts, lists and plain objects the model,
dataset and loader hold, e.g. one generator per device) and checks each by its path. The walk never
enters a Python module (FSDP1's device handle holds the `torch` module), and the process's own
streams (torch's default generators, numpy's and Python's global ones) are left to `rng_streams`,
which names them once ("torch CPU"), however many paths reach them.
"""

from __future__ import annotations

import pickle
import random
import types

import torch
from torch import nn

from .built_names import named_modules_as_built

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


def process_generators() -> set[int]:
    """ids of the generators behind the process's global streams: torch's default CPU and CUDA
    generators, Python's `random` module's and numpy's global one."""
    found = [torch.default_generator, random._inst]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        found += list(torch.cuda.default_generators)
    if numpy is not None:
        found.append(numpy.random.mtrand._rand)
    return {id(generator) for generator in found}


def owned_generators(roots: dict[str, object]) -> dict[str, object]:
    """Every generator reachable from `roots` (name -> model, dataset or loader) by attributes, dict
    values and list items, by path (`model.prefix_layers.0.dropout.generator`, `loader.generators[1]`);
    one path per generator. A module root is searched module by module, so a path names the module."""
    found: dict[str, object] = {}
    seen: set[int] = process_generators()

    def walk(value, path: str, depth: int) -> None:
        if id(value) in seen or depth > SEARCH_DEPTH or isinstance(value, types.ModuleType):
            return
        seen.add(id(value))
        if is_generator(value):
            found[path] = value
        elif isinstance(value, dict):
            for key, item in value.items():
                label = f"<tensor {list(key.shape)}>" if isinstance(key, torch.Tensor) else repr(key)
                walk(item, f"{path}[{label}]", depth + 1)
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
            for module_name, module in named_modules_as_built(root):
                for name, item in vars(module).items():
                    if name not in MODULE_INTERNALS and not name.startswith(WRAPPER_ATTRIBUTES):
                        walk(item, ".".join(part for part in (root_name, module_name, name) if part), 1)
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
