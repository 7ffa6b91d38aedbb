"""The reference stack held the way Lightning Fabric holds a LightningModule, written here so the
project's tests need no Lightning: `FabricLikeModule` keeps the module it calls as `_forward_module`
(FSDP1's root, or the model itself) and the user's module beside it as `_original_module`, reads
`state_dict` from the latter, and runs a step method through forward as `_FabricModule` does; the
user's module (`StepModule`) has its own `training_step`, which calls the decoder inside it, and
`MethodStep` is a training step that calls that method instead of the model."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from torchmatrix.models.parallel import parallelize
from torchmatrix.models.trainer_held import UserModule
from torchmatrix.models.transformer import build_model


class StepModule(UserModule):
    """A LightningModule's place: the decoder as `.model`, and a `training_step` that calls it directly."""

    def body_calls(self) -> dict[str, int]:
        return self.model.body_calls()

    def training_step(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.model(**batch).loss


class FabricLikeModule(nn.Module):
    """Fabric's `_FabricModule` in its parts the suites meet: `_forward_module` called by forward,
    `_original_module` answering attributes and `state_dict`, step methods patched in as the original
    module's forward and run through `_forward_module` when a wrapper (FSDP1) sits between them."""

    STEP_METHODS = ("training_step",)

    def __init__(self, forward_module: nn.Module, original_module: nn.Module):
        super().__init__()
        self._forward_module = forward_module
        self._original_module = original_module

    def forward(self, *args, **kwargs):
        return self._forward_module(*args, **kwargs)

    def state_dict(self, *args, **kwargs):
        return self._original_module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self._original_module.load_state_dict(state_dict, strict=strict, assign=assign)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            original = super().__getattr__("_original_module")
            if name in self.STEP_METHODS and super().__getattr__("_forward_module") is not original:
                return self.through_forward(name)
            return getattr(original, name)

    def through_forward(self, name: str):
        """`name` of the original module, run as its forward inside `_forward_module`'s call."""
        original = self._original_module
        forward = original.forward

        def as_forward(*args, **kwargs):
            original.forward = forward
            return getattr(original, name)(*args, **kwargs)

        def call(*args, **kwargs):
            original.forward = as_forward
            return self.forward(*args, **kwargs)

        return call


def build_step_model(cell: Mapping[str, object], **keywords) -> StepModule:
    """Component `model`: the reference decoder inside a module with its own `training_step`."""
    return StepModule(build_model(cell, **keywords))


def parallelize_fabric_like(
    model: nn.Module, cell: Mapping[str, object], *, device: torch.device, **keywords
) -> FabricLikeModule:
    """Component `parallelize`: the reference `parallelize`, held as Fabric holds its result."""
    return FabricLikeModule(parallelize(model, cell, device=device, **keywords), model)


class MethodStep:
    """Component `training_step`: the loss from the model's own method, `model.training_step(batch)`."""

    def __init__(self, *, model, optimizer):
        self.model = model

    def loss(self, batch) -> torch.Tensor:
        return self.model.training_step(batch)
