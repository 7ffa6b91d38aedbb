"""Optimizer state as the suites compare it: one function per optimizer turns one parameter's
state, as this rank holds it, into plain tensors, so quantized state (a tensor subclass inside a
DTensor, or codes beside their scales) is compared by the values it stands for.

The suites never ask which library they hold: they call `state_adapter(components, value)`,
which is the `[components] plain_state_<value>` entry when matrix.toml has one and `plain_state`
otherwise.
"""

from __future__ import annotations

import torch

DEFAULT_ADAPTER = "torchmatrix.suites.optimizer_state:plain_state"


def plain_state(state: dict) -> dict:
    """The default adapter: every tensor as its local shard (a DTensor's `to_local()`), dequantized
    when that shard is a tensor subclass with `dequantize()` (torchao's OptimState8bit, 4bit, Fp8);
    other values unchanged."""
    return {key: plain_tensor(value) if isinstance(value, torch.Tensor) else value for key, value in state.items()}


def plain_tensor(value: torch.Tensor) -> torch.Tensor:
    """This rank's values of one state tensor as a plain torch.Tensor."""
    local = local_part(value)
    if is_subclass(local) and hasattr(local, "dequantize"):
        local = local.dequantize()
    return local.detach()


def local_part(value: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor; the tensor itself otherwise."""
    from torch.distributed.tensor import DTensor

    return value.to_local() if isinstance(value, DTensor) else value


def is_subclass(tensor: torch.Tensor) -> bool:
    return type(tensor) not in (torch.Tensor, torch.nn.Parameter)


def state_adapter(components: dict, optimizer_value: str):
    """The adapter for this optimizer axis value: `[components] plain_state_<value>`, or `plain_state`."""
    from torchmatrix.testing import load

    return load(components.get(f"plain_state_{optimizer_value}", DEFAULT_ADAPTER))


def quantized_keys(state: dict) -> list[str]:
    """The state keys stored in another form than plain floats (a tensor subclass, or integer codes
    of more than one element): what shows a quantizing optimizer really quantized this state."""
    return sorted(
        key
        for key, value in state.items()
        if isinstance(value, torch.Tensor)
        and (
            is_subclass(local_part(value))
            or (not value.is_floating_point() and value.dtype != torch.bool and value.numel() > 1)
        )
    )
