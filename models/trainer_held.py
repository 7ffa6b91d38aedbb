"""The reference stack as a trainer holds it, in Lightning Fabric's shape: the user's module keeps
the decoder as `.model`, `parallelize` returns it inside a module that forwards every call and
attribute as `_forward_module`, and the checkpointer saves the module inside that wrapper, as
`fabric.save` does. What the suites hold names a parameter `_forward_module.model.layers.0...`,
the checkpoint `model.layers.0...`: the suites must read names through a wrapper they do not know.
`OwnBackwardModule` is that wrapper refusing any backward but the trainer's own, with its
`training_step` (`OwnBackwardStep`): the suites must run the stack's backward."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from .checkpoint import Checkpointer
from .parallel import parallelize
from .transformer import build_model


class UserModule(nn.Module):
    """The user's training module (a LightningModule's place): the decoder as `.model`, its config and layers passed on."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    @property
    def config(self):
        return self.model.config

    def decoder_layers(self) -> list[nn.Module]:
        return self.model.decoder_layers()

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


class TrainerModule(nn.Module):
    """What a trainer hands back from its setup (Fabric's `_FabricModule`): calls and unknown
    attributes go to `_forward_module`."""

    def __init__(self, forward_module: nn.Module):
        super().__init__()
        self._forward_module = forward_module

    def forward(self, *args, **kwargs):
        return self._forward_module(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("_forward_module"), name)


class OwnBackwardModule(TrainerModule):
    """The trainer's wrapper as Fabric's under `FSDPStrategy`: the loss it returns refuses a backward
    other than the trainer's own (`fabric.backward(loss)`), so a suite that calls `loss.backward()`
    itself errors on this stack, and one that takes the stack's `training_step` runs."""

    def __init__(self, forward_module: nn.Module):
        super().__init__(forward_module)
        self.in_own_backward = False

    def forward(self, *args, **kwargs):
        output = super().forward(*args, **kwargs)
        if output.loss.requires_grad:
            output.loss.register_hook(self.refuse_other_backward)
        return output

    def refuse_other_backward(self, grad: torch.Tensor) -> torch.Tensor:
        if not self.in_own_backward:
            raise RuntimeError("this trainer requires you to call its own backward(loss), not loss.backward()")
        return grad


class OwnBackwardStep:
    """The `training_step` component of that trainer: the loss as the model returns it, back-propagated
    by the trainer's own backward; the optimizer steps as built."""

    def __init__(self, *, model: OwnBackwardModule, optimizer):
        self.model = model

    def backward(self, loss: torch.Tensor) -> None:
        self.model.in_own_backward = True
        try:
            loss.backward()
        finally:
            self.model.in_own_backward = False


def build_user_model(cell: Mapping[str, object], **keywords) -> UserModule:
    """Component `model`: the reference decoder inside the user's module."""
    return UserModule(build_model(cell, **keywords))


def parallelize_held(
    model: nn.Module, cell: Mapping[str, object], *, device: torch.device, **keywords
) -> TrainerModule:
    """Component `parallelize`: the reference `parallelize`, then the trainer's wrapper around its result."""
    return TrainerModule(parallelize(model, cell, device=device, **keywords))


def parallelize_own_backward(
    model: nn.Module, cell: Mapping[str, object], *, device: torch.device, **keywords
) -> OwnBackwardModule:
    """Component `parallelize`: the reference `parallelize`, then the wrapper that refuses a plain `loss.backward()`."""
    return OwnBackwardModule(parallelize(model, cell, device=device, **keywords))


def held_module(model: nn.Module) -> nn.Module:
    """The module inside the trainer's wrapper: what the trainer's save and load go through."""
    return model._forward_module if isinstance(model, TrainerModule) else model


class HeldModuleCheckpointer(Checkpointer):
    """The reference checkpoint written through the module inside the trainer's wrapper, so its keys
    are the user's module's names (`model.layers.0...`), as `fabric.save` writes them."""

    def model_state(self, model) -> dict:
        return super().model_state(held_module(model))

    def optimizer_state(self, model, optimizer) -> dict:
        return super().optimizer_state(held_module(model), optimizer)

    def restore_model(self, model, state: dict) -> None:
        super().restore_model(held_module(model), state)

    def restore_optimizer(self, model, optimizer, state: dict) -> None:
        super().restore_optimizer(held_module(model), optimizer, state)
