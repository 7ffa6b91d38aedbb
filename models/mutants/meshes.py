"""Known-bad variants for 2-D meshes; the dtensor_optim suite must fail on each.

Both train correctly, which is why they survive: the loss curve of either matches the reference
bit for bit or nearly, and only the layout of parameters and optimizer state is wrong.
Point `[components] parallelize` or an `optimizer_<value>` at one of these to run the suite on it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import PrepareModuleInput

from ..optim import PrecisionAwareAdamW
from ..parallel import TENSOR_PARALLEL_PLAN, parallelize

O_PROJ_REPLICATED_PLAN = {
    **TENSOR_PARALLEL_PLAN,
    "o_proj": PrepareModuleInput(
        input_layouts=(Shard(-1),), desired_input_layouts=(Replicate(),), use_local_output=True
    ),
}
"""The reference plan, except that o_proj gathers the attention heads and runs whole on every tp rank
(a "fix" for a shape error that all-gathers instead of splitting rowwise): the same numbers, every tp
rank keeping all of o_proj's weight and all of its optimizer state."""


def parallelize_with_o_proj_replicated(
    model: nn.Module,
    cell,
    *,
    device: torch.device,
    activation_checkpointing: bool = False,
    mesh: DeviceMesh | None = None,
) -> nn.Module:
    """The reference `parallelize` with a tensor-parallel plan that leaves one projection (o_proj) replicated."""
    return parallelize(
        model,
        cell,
        device=device,
        activation_checkpointing=activation_checkpointing,
        mesh=mesh,
        tensor_parallel_plan=O_PROJ_REPLICATED_PLAN,
    )


class FlattenedMeshStateAdamW(PrecisionAwareAdamW):
    """Keeps the state of a param on a 2-D mesh as a 1-D DTensor over the flattened mesh (every rank,
    `Shard(0)`), as optimizer code written for 1-D meshes does when it wraps a shard with the world's
    mesh: the update still runs on the right local shard, but the state claims a global shape of every
    rank's shard end to end, replicas included, so DCP saves and reshards a tensor the param is not."""

    def _initial_state(self, param: torch.Tensor) -> dict:
        return {key: _flattened(value) for key, value in super()._initial_state(param).items()}


def _flattened(value: torch.Tensor) -> torch.Tensor:
    """A DTensor state of a 2-D mesh re-wrapped from its local shard over all ranks; anything else as is."""
    if not isinstance(value, DTensor) or value.device_mesh.ndim < 2:
        return value
    world = DeviceMesh.from_group(dist.group.WORLD, value.device_mesh.device_type)
    return DTensor.from_local(value.to_local(), world, [Shard(0)], run_check=False)
