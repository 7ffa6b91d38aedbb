"""Optimizer state as the suites compare it: one function per optimizer turns one parameter's
state, as this rank holds it, into plain tensors, so quantized state (a tensor subclass inside a
DTensor, or codes beside their scales) is compared by the values it stands for.

The suites never ask which library they hold: they call `state_adapter(components, value)`,
which is the `[components] plain_state_<value>` entry when matrix.toml has one and `plain_state`
otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from torchmatrix.testing import inner_optimizers

DEFAULT_ADAPTER = "torchmatrix.suites.state.optimizer_state:plain_state"


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


def quantized_state_kinds(optimizer) -> list[str]:
    """The classes of the state tensors held as tensor subclasses (torchao's OptimState8bit, ...):
    the suites compare their dequantized values, which do not pin the codes and scales stored."""
    return sorted(
        {
            type(local_part(value)).__name__
            for state in optimizer_state_of(optimizer).values()
            for value in state.values()
            if isinstance(value, torch.Tensor) and is_subclass(local_part(value))
        }
    )


def is_subclass(tensor: torch.Tensor) -> bool:
    return type(tensor) not in (torch.Tensor, torch.nn.Parameter)


def optimizer_state_of(optimizer) -> dict:
    """param -> state over the optimizers that hold it (torchmatrix.components.optimizer_like:inner_optimizers)."""
    return {param: state for part in inner_optimizers(optimizer) for param, state in part.state.items()}


def param_groups_of(optimizer) -> list[dict]:
    """The param groups whose `lr` the scheduler sets, over the optimizers that hold the state."""
    return [group for part in inner_optimizers(optimizer) for group in part.param_groups]


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


# What every torch optimizer object keeps for torch itself (hooks, profiling names, warnings), and the
# flag an LR scheduler sets on it: the same for any run, never state a resume must restore.
TORCH_OPTIMIZER_BOOKKEEPING = frozenset(
    [*vars(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)), "_opt_called"]
)
PLAIN_VALUES = (int, float, bool, str, type(None))


@dataclass(frozen=True)
class ParamName:
    """A parameter inside an optimizer attribute (a `{param: flag}` routing table's key, a list of
    params), compared by its name: a rebuilt model's params are other objects with the same names."""

    name: str

    def __repr__(self) -> str:
        return f"<param {self.name}>"


def optimizer_attributes(optimizer, param_names: dict[int, str] | None = None) -> dict[str, object]:
    """What the optimizer object carries besides `.state`, `.param_groups` and torch's own bookkeeping
    that a `step()` may read: counters and scalars (numbers, strings, tensors, lists and dicts of
    them), by attribute name, tensors copied to the CPU, and the parameters among them (`param_names`:
    id(param) -> name) as `ParamName`s. Methods, dtypes and other objects are left out."""
    found = {}
    for name, value in vars(optimizer).items():
        if name in TORCH_OPTIMIZER_BOOKKEEPING:
            continue
        plain = plain_value(value, param_names or {})
        if plain is not NOT_PLAIN:
            found[name] = plain
    return found


NOT_PLAIN = object()


def plain_value(value, param_names: dict[int, str]):
    """`value` as numbers, strings, CPU tensors, parameter names, lists and dicts of them; NOT_PLAIN
    when it is anything else (a tensor key that is no parameter of the model among them)."""
    if isinstance(value, PLAIN_VALUES):
        return value
    if isinstance(value, torch.Tensor):
        if id(value) in param_names:
            return ParamName(param_names[id(value)])
        return plain_tensor(value).to("cpu", copy=True)
    if isinstance(value, (list, tuple)):
        items = [plain_value(item, param_names) for item in value]
        return NOT_PLAIN if any(item is NOT_PLAIN for item in items) else items
    if isinstance(value, dict):
        items = {plain_key(key, param_names): plain_value(item, param_names) for key, item in value.items()}
        return NOT_PLAIN if NOT_PLAIN in items or any(item is NOT_PLAIN for item in items.values()) else items
    return NOT_PLAIN


def plain_key(key, param_names: dict[int, str]):
    """A dict key as `plain_value` keeps it: a parameter by its name, a hashable plain value as it is."""
    if isinstance(key, torch.Tensor):
        return ParamName(param_names[id(key)]) if id(key) in param_names else NOT_PLAIN
    return key if isinstance(key, (*PLAIN_VALUES, tuple)) else NOT_PLAIN
