"""The generator walk of the resume suite (suites/state/owned_generators.py): generators a model owns are
found by path; a Python module on the way is never entered, and the process's own streams reached
through some object are left to the names `rng_streams` gives them, so one cause is named once."""

from __future__ import annotations

import random

import torch
from torch import nn

from suites.state.owned_generators import owned_generators


class DeviceHandle:
    """FSDP1's `_FSDPDeviceHandle` in small: it keeps a backend module, which holds `torch` itself."""

    def __init__(self):
        self._DeviceHandle__backend = torch.cpu
        self.also = {"torch": torch, "generator": torch.default_generator, "python": random._inst}


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(2, 2)
        self.generator = torch.Generator().manual_seed(0)
        self._device_handle = DeviceHandle()


def test_a_generator_the_model_owns_is_found_and_no_path_leads_into_a_module_or_to_a_process_stream():
    model = nn.Sequential(Layer())
    found = owned_generators({"model": model})
    assert list(found) == ["model.0.generator"]
    assert found["model.0.generator"] is model[0].generator


def test_a_process_stream_held_as_an_attribute_is_not_listed_twice():
    holder = type("Holder", (), {})()
    holder.rng = torch.default_generator
    holder.own = random.Random(1)
    assert list(owned_generators({"loader": holder})) == ["loader.own"]
