"""Known-bad components for the parallel_equivalence suite: each makes a parallel cell train
differently from the single-process run in the way a real stack did, and
suites/test_parallel_equivalence.py must fail on every one of them.

Point `[components] clip_grad_norm`, `parallelize`, `training_step` or `model` at one of these to
see it caught.
"""

from __future__ import annotations

from functools import partial
from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from torchmatrix.suites.components.model_output import call_model, loss_of
from torchmatrix.testing import current_device

from .. import parallel
from ..transformer import DecoderOutput, PrefixExpertDecoder, build_model


def clip_grad_norm_of_local_shards(model, *, max_norm: float) -> torch.Tensor:
    """Clips by the norm of this rank's own shards: what `torch.nn.utils.clip_grad_norm_` does on an
    FSDP1 model, whose gradients are this rank's flat shards (FSDP's own `clip_grad_norm_` reduces
    across ranks), and what a trainer does that clips `p.grad.to_local()` to keep DTensors out of its
    clipping code under FSDP2: the partial norm of pytorch#170862. Each rank returns and clips by
    its own norm, smaller than the whole model's."""
    shards = [
        param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
        for param in model.parameters()
        if param.grad is not None
    ]
    total = torch.nn.utils.get_total_norm(shards)
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    with torch.no_grad():
        for shard in shards:
            shard.mul_(coefficient)
    return total


BF16_REDUCTIONS = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)


def parallelize_reducing_in_bf16(model, cell, *, device, activation_checkpointing=False, mesh=None):
    """The reference parallelize with every FSDP unit given a mixed-precision policy that reduces
    gradients in bf16 (FSDP2's `MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)`, FSDP1's
    `MixedPrecision(reduce_dtype=torch.bfloat16)`), parameters and compute left in fp32: under a
    declared fp32 reduction, the pytorch#190626 class (a reduction narrower than the policy says)."""
    with (
        mock.patch.object(parallel, "fully_shard", partial(fully_shard, mp_policy=BF16_REDUCTIONS)),
        mock.patch.object(
            parallel,
            "FullyShardedDataParallel",
            partial(FullyShardedDataParallel, mixed_precision=MixedPrecision(reduce_dtype=torch.bfloat16)),
        ),
    ):
        return parallel.parallelize(
            model, cell, device=device, activation_checkpointing=activation_checkpointing, mesh=mesh
        )


# ---- components that read the world they run in ------------------------------------------------
# Each divides by the world's size once more, on top of the data-parallel mean the wrapper already
# takes. A reference that runs in the cell's world divides alike and agrees; one process does not.


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


class LossAveragedOverWorldStep:
    """A `training_step` whose loss divides the model's loss by the world's size, as a trainer does
    that averages by hand over ranks under a wrapper that already averages gradients."""

    def __init__(self, model, optimizer):
        self.model = model

    def loss(self, batch) -> torch.Tensor:
        return loss_of(call_model(self.model, batch)) / world_size()


class BackwardScaledByWorldStep:
    """A `training_step` whose backward scales the loss by 1 / world size before backpropagating: the
    loss it reports is right, every gradient is divided by the world's size once more."""

    def __init__(self, model, optimizer):
        self.model = model

    def backward(self, loss: torch.Tensor) -> None:
        (loss / world_size()).backward()


class LossOverOwnMeshStep:
    """A `training_step` that builds a DeviceMesh of its own over the default group when it is
    built and divides the loss by that mesh's size: the world read through a mesh, not a call."""

    def __init__(self, model, optimizer):
        self.model = model
        self.mesh = init_device_mesh(current_device().type, (world_size(),)) if dist.is_initialized() else None

    def loss(self, batch) -> torch.Tensor:
        ranks = self.mesh.size() if self.mesh is not None else 1
        return loss_of(call_model(self.model, batch)) / ranks


class WorldAveragingDecoder(PrefixExpertDecoder):
    """The reference decoder whose forward divides its loss by the world's size: the division inside
    the model, where a trainer's loss function is often folded in."""

    def forward(self, tokens, past_key_values=None) -> DecoderOutput:
        output = super().forward(tokens, past_key_values)
        return output._replace(loss=output.loss / world_size())


def build_model_averaging_over_world(cell, **keywords) -> PrefixExpertDecoder:
    """`model` factory: the reference decoder, its forward divided by the world's size."""
    model = build_model(cell, **keywords)
    model.__class__ = WorldAveragingDecoder
    return model
