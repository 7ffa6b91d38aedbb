"""The `parallelize` component for torchtitan's Llama: torchtitan's own `parallelize_llama`
(its full activation checkpointing, then its FSDP2 `apply_fsdp_to_decoder`), driven by the
configs its trainer would pass (torchmatrix/components/protocol.py).

torchtitan has no FSDP1, so `fsdp=fsdp1` is refused here and excluded in matrix.toml.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed import ParallelDims
from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.models.common.decoder import Decoder
from torchtitan.models.llama3 import parallelize_llama

from torchmatrix.models.parallel import parallelize as reference_parallelize

FSDP_KINDS = ("none", "fsdp2")


def parallelize(
    model: nn.Module,
    cell: Mapping[str, object],
    *,
    device: torch.device,
    activation_checkpointing: bool = False,
    mesh: DeviceMesh | None = None,
) -> nn.Module:
    """`fsdp=none`: torchtitan's checkpointing only; `fsdp=fsdp2`: `parallelize_llama` over `mesh`."""
    fsdp = cell["fsdp"]
    if fsdp not in FSDP_KINDS:
        raise ValueError(f"cell axis fsdp={fsdp!r}: torchtitan supports {', '.join(FSDP_KINDS)}")
    if not isinstance(model, Decoder):
        # Only for the protocol: dtensor_optim also parallelizes its own probe model, which is no
        # torchtitan Decoder; the reference FSDP2 wrapping shards it instead.
        return reference_parallelize(model, cell, device=device, mesh=mesh)
    ac_config = FullAC.Config() if activation_checkpointing else None
    if fsdp == "none":
        if ac_config is not None:
            ac_config.build().apply(model)
        return model.to(device)
    # Only for the protocol, the next two lines and ParallelDims' last two arguments: the suites
    # hand over the mesh, a sub-world one for the reshard tests, where torchtitan builds its own
    # over every rank; its "fsdp" axis is preset to it, which needs the partial_dtensor backend.
    if mesh is None:
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    parallel_dims = ParallelDims(
        dp_replicate=1,
        dp_shard=mesh.size(),
        cp=1,
        tp=1,
        pp=1,
        ep=1,
        world_size=mesh.size(),
        spmd_backend="partial_dtensor",
        _single_axis_meshes={"fsdp": mesh},
    )
    param_dtype = "bfloat16" if next(model.parameters()).dtype == torch.bfloat16 else "float32"
    model.to(device)
    model = parallelize_llama(
        model,
        parallel_dims=parallel_dims,
        training=TrainingConfig(mixed_precision_param=param_dtype),
        parallelism=ParallelismConfig(spmd_backend="partial_dtensor"),
        compile_config=CompileConfig(),
        ac_config=ac_config,
        dump_folder="",
    )
    if dist.get_backend() == "gloo":
        # CPU-simulation limit: torchtitan sets FSDP's gradient divide factor to 1 (its trainer
        # divides by the global token count), which torch reduces with PREMUL_SUM; gloo has none.
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
    return model
