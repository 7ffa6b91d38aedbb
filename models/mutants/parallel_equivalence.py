"""Known-bad components for the parallel_equivalence suite: each makes a parallel cell train
differently from the single-process run in the way a real stack did, and
suites/test_parallel_equivalence.py must fail on every one of them.

Point `[components] clip_grad_norm` or `parallelize` at one of these to see it caught.
"""

from __future__ import annotations

from functools import partial
from unittest import mock

import torch
from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from .. import parallel


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
