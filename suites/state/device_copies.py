"""Copies of nested values (a tensor, or a mapping, tuple or list of them) on another device: a
loader's batch kept on the CPU for replay, a value broadcast between ranks as CPU tensors."""

from __future__ import annotations

import torch


def on_device(value, device):
    """A copy of `value` with every tensor in it on `device`; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device, copy=True)
    if isinstance(value, dict):
        return {key: on_device(item, device) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(on_device(item, device) for item in value)
    return value
