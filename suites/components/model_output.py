"""What a model's forward returns, read the way training stacks write it: the suites call the
model as its trainer does and take the loss from whatever shape the forward chose."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def loss_of(output) -> torch.Tensor:
    """The loss in ``output``: the tensor itself, a tuple's or list's first element, a mapping's
    ``"loss"``, or the ``.loss`` attribute (transformers' ModelOutput, a NamedTuple)."""
    if isinstance(output, torch.Tensor):
        return output
    if (loss := named_field(output, "loss")) is not None:
        return loss
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(
        f"the model returned {type(output).__name__}, which holds no loss (or a loss of None: labels not passed?): "
        f'return the loss tensor, a tuple whose first element is the loss, a dict with "loss", or an object with .loss'
    )


def call_model(model, batch):
    """``model(**batch)`` for a mapping of keyword arguments, ``model(*batch)`` for a tuple or list,
    ``model(batch)`` for a tensor: a loader's batch is passed as its trainer would pass it."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def cache_on(output):
    """The cache the output carries: its ``.past_key_values`` or ``["past_key_values"]`` (any pytree),
    else None (a bare loss tensor or a tuple carries none by name)."""
    return named_field(output, "past_key_values")


def named_field(output, name: str):
    """``output[name]`` of a mapping, else ``output.<name>`` (a ModelOutput, a NamedTuple, a
    dataclass), else None."""
    if isinstance(output, Mapping):
        return output.get(name)
    return getattr(output, name, None)
