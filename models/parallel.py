"""Apply a cell's tensor parallelism, activation checkpointing, compile and data-parallel wrapper
(fsdp = none | fsdp1 | fsdp2) over the cell's mesh (mesh = flat | hsdp | fsdp_tp).

Order, as torchtitan's parallelize functions and the PyTorch FSDP docs have it: the
tensor-parallel plan first (on a mesh with a "tp" dim), then checkpointing per layer, then
compile each layer (cell key ``compile``, models/block_compile.py), then shard each layer, then
the root, each under the mixed-precision policy the cell's ``accumulation`` names (FSDP2's
``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`` for bf16). Every FSDP unit
therefore wraps one whole checkpointed layer, so its parameters are gathered before the layer's
recompute runs during backward (FSDP2: ``fully_shard`` on each block, then on the model; FSDP1:
the same units through ``ModuleWrapPolicy``, which is the structure ``apply_activation_checkpointing``
after wrapping produces). The mesh decides the
layout: FSDP2 over a ("dp_replicate", "dp_shard") mesh is HSDP, over ("dp_shard", "tp") it
shards the dp_shard dim of parameters the plan already split on tp.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from torchmatrix.components.accumulation_axis import accumulation_of, param_dtype_of
from torchmatrix.testing import cell_mesh

from .block_compile import compile_blocks

FSDP_KINDS = ("none", "fsdp1", "fsdp2")
TP_DIM = "tp"
TENSOR_PARALLEL_PLAN: dict[str, ParallelStyle] = {
    "q_proj": ColwiseParallel(),
    "k_proj": ColwiseParallel(),
    "v_proj": ColwiseParallel(),
    "o_proj": RowwiseParallel(),
    "mlp_in": ColwiseParallel(),
    "mlp_out": RowwiseParallel(),
}
"""Megatron's split of each decoder layer: q/k/v and the MLP's first projection by output features
(each tp rank computes its own heads and hidden units), o and the MLP's second by input features,
summed across tp ranks; so the tp ranks exchange activations twice per layer."""


def parallelize(
    model: nn.Module,
    cell: Mapping[str, object],
    *,
    device: torch.device,
    activation_checkpointing: bool = False,
    mesh: DeviceMesh | None = None,
    tensor_parallel_plan: Mapping[str, ParallelStyle] = TENSOR_PARALLEL_PLAN,
) -> nn.Module:
    """Component ``parallelize``: the model ready to train on ``device`` under ``cell["fsdp"]``.

    ``model`` must offer ``decoder_layers()`` (the checkpointing and sharding units, each
    with a boolean ``checkpointing`` attribute). FSDP shards over ``mesh``, by default the one
    the cell's ``mesh`` names over every rank (torchmatrix.testing.cell_mesh); a mesh with a "tp"
    dim first gets ``tensor_parallel_plan`` applied to each decoder layer over that dim (the suites
    never pass one; models/mutants/meshes.py does).
    """
    fsdp = cell["fsdp"]
    if fsdp not in FSDP_KINDS:
        raise ValueError(f"cell axis fsdp={fsdp!r}: expected one of {', '.join(FSDP_KINDS)}")
    if fsdp == "none":
        switch_checkpointing(model, activation_checkpointing)
        compile_blocks(model, cell)
        return model.to(device)
    if mesh is None:
        mesh = cell_mesh(cell, device.type)
    if mesh.ndim > 1 and fsdp != "fsdp2":
        raise ValueError(
            f"fsdp={fsdp!r} shards over a 1-D mesh; a {mesh.ndim}-D mesh {mesh.mesh_dim_names} needs fsdp2"
        )
    model.to(device)
    if TP_DIM in (mesh.mesh_dim_names or ()):
        apply_tensor_parallel(model, mesh[TP_DIM], tensor_parallel_plan)
    switch_checkpointing(model, activation_checkpointing)
    compile_blocks(model, cell)
    if fsdp == "fsdp1":
        if param_dtype_of(cell) != "float32":
            raise ValueError(
                f"cell axis accumulation={accumulation_of(cell)!r} computes in {param_dtype_of(cell)} through FSDP2's "
                "MixedPrecisionPolicy; use fsdp2 for it, or accumulation='fp32' with fsdp1"
            )
        return wrap_fsdp1(model, device, mesh)
    return shard_fsdp2(model, device, data_parallel_mesh(mesh), mixed_precision_policy(cell))


def switch_checkpointing(model: nn.Module, on: bool) -> None:
    """Set every decoder layer's checkpointing flag; its forward then runs the body under ``checkpoint``."""
    for layer in model.decoder_layers():
        layer.checkpointing = on


def apply_tensor_parallel(
    model: nn.Module, tp_mesh: DeviceMesh, plan: Mapping[str, ParallelStyle] = TENSOR_PARALLEL_PLAN
) -> None:
    """``parallelize_module`` each decoder layer with ``plan`` over ``tp_mesh``. A layer with none of
    the plan's projections (dtensor_optim's probe) stays whole; one with only some of them is an error,
    since torch would skip the missing keys with a warning and leave them replicated."""
    for layer in model.decoder_layers():
        present = [name for name in plan if hasattr(layer, name)]
        if not present:
            continue
        if len(present) != len(plan):
            missing = sorted(set(plan) - set(present))
            raise ValueError(f"{type(layer).__name__} lacks the tensor-parallel plan's {', '.join(missing)}")
        parallelize_module(layer, tp_mesh, dict(plan))


def data_parallel_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """What FSDP2 shards over: the whole mesh (1-D, or HSDP's replicate x shard), or its data-parallel dim beside tp."""
    names = mesh.mesh_dim_names or ()
    if TP_DIM not in names:
        return mesh
    data_dims = tuple(name for name in names if name != TP_DIM)
    return mesh[data_dims[0]] if len(data_dims) == 1 else mesh[data_dims]


def wrap_fsdp1(model: nn.Module, device: torch.device, mesh: DeviceMesh) -> FullyShardedDataParallel:
    """FSDP1 with one unit per decoder layer plus the root; ``device_id`` makes it work on CPU too.

    ``use_orig_params=True`` keeps per-parameter names and gradients visible, which the
    suites compare and ``summon_full_params(with_grads=True)`` needs.
    """
    layer_types = {type(layer) for layer in model.decoder_layers()}
    return FullyShardedDataParallel(
        model,
        auto_wrap_policy=ModuleWrapPolicy(layer_types),
        process_group=mesh.get_group(),
        device_id=device,
        use_orig_params=True,
    )


def mixed_precision_policy(cell: Mapping[str, object]) -> MixedPrecisionPolicy | None:
    """FSDP2's policy for the cell: parameters gathered and computed in the cell's ``param_dtype_of``,
    gradients reduced (and, with sync off, accumulated) in float32; None (fully_shard's fp32 default)
    where that is float32."""
    param_dtype = param_dtype_of(cell)
    if param_dtype == "float32":
        return None
    return MixedPrecisionPolicy(param_dtype=getattr(torch, param_dtype), reduce_dtype=torch.float32)


def shard_fsdp2(
    model: nn.Module, device: torch.device, mesh: DeviceMesh, policy: MixedPrecisionPolicy | None = None
) -> nn.Module:
    """FSDP2: ``fully_shard`` each decoder layer, then the root, under ``policy`` (None: fully_shard's default)."""
    keywords = {} if policy is None else {"mp_policy": policy}
    model.to(device)
    for layer in model.decoder_layers():
        fully_shard(layer, mesh=mesh, **keywords)
    fully_shard(model, mesh=mesh, **keywords)
    return model
