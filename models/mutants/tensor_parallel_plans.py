"""Tensor-parallel plans for the parallel_equivalence suite: known-bad ones whose column-wise
projections get their input's gradient summed across tp ranks twice, never, or over the wrong
ranks, or twice in the deeper layers only (the forward and the loss untouched: only the backward
differs), and a valid plan of another shape that must stay green. Point `[components] parallelize` at one of the `parallelize_*` here."""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from torchmatrix.testing import cell_mesh

from .. import parallel


class InputGradientReducedTwice(ColwiseParallel):
    """Column-wise, with the input's gradient all-reduced across the tp ranks once more after
    torch's own all-reduce: what a hand-written sequence-parallel region adds on top of DTensor's.
    Every earlier layer's gradient is tp times too large in that path."""

    def _apply(self, module, device_mesh):
        module.register_forward_pre_hook(partial(gradient_hook, partial(all_reduced, group=device_mesh.get_group())))
        return super()._apply(module, device_mesh)


class InputGradientOverTheWorld(ColwiseParallel):
    """Column-wise, with the input's gradient averaged once more over the whole world, data-parallel
    ranks too: a hand-written gradient sync over the default group inside the tp region, which mixes
    one data-parallel shard's activations' gradients into another's."""

    def _apply(self, module, device_mesh):
        module.register_forward_pre_hook(partial(gradient_hook, averaged_over_world))
        return super()._apply(module, device_mesh)


class InputGradientNeverReduced(ColwiseParallel):
    """Column-wise, with the input's gradient left as this tp rank's partial product: the DTensor's
    Partial gradient relabelled Replicate, so torch's all-reduce is skipped (a custom autograd
    function around the projection that returns `grad.to_local()`)."""

    def _apply(self, module, device_mesh):
        distributed = super()._apply(module, device_mesh)
        module.register_forward_pre_hook(relabel_partial_gradient)  # after the plan's: its input is the DTensor
        return distributed


def gradient_hook(rewrite, module, args):
    """Forward pre-hook: the input through a view of its own, whose gradient `rewrite` replaces."""
    alias = args[0].view_as(args[0])
    alias.register_hook(rewrite)
    return (alias, *args[1:])


def all_reduced(gradient: torch.Tensor, group) -> torch.Tensor:
    summed = gradient.clone()
    dist.all_reduce(summed, group=group)
    return summed


def averaged_over_world(gradient: torch.Tensor) -> torch.Tensor:
    return all_reduced(gradient, group=None) / dist.get_world_size()


def relabel_partial_gradient(module, args) -> None:
    args[0].register_hook(
        lambda gradient: DTensor.from_local(gradient.to_local(), gradient.device_mesh, [Replicate()], run_check=False)
    )


def parallelize_reducing_deeper_input_gradients_twice(
    model, cell, *, device, activation_checkpointing=False, mesh=None
):
    """The reference parallelize, but every layer past the first of its stack sums its column-wise
    projections' input gradients across tp ranks twice, as InputGradientReducedTwice does: a plan
    built per layer index that is off by one. A bug that needs depth: one layer per stack hides it."""
    if cell["fsdp"] == "none":
        return parallel.parallelize(model, cell, device=device, activation_checkpointing=activation_checkpointing)
    mesh = mesh if mesh is not None else cell_mesh(cell, device.type)
    tensor_parallel = parallel.TP_DIM in (mesh.mesh_dim_names or ())
    twice = (
        partial(gradient_hook, partial(all_reduced, group=mesh[parallel.TP_DIM].get_group()))
        if tensor_parallel
        else None
    )
    for layer in model.decoder_layers():
        if tensor_parallel and layer.layer_idx >= 1:
            for name, style in parallel.TENSOR_PARALLEL_PLAN.items():
                if isinstance(style, ColwiseParallel):
                    getattr(layer, name).register_forward_pre_hook(twice)
    return parallel.parallelize(
        model, cell, device=device, activation_checkpointing=activation_checkpointing, mesh=mesh
    )


def plan_with(colwise: type[ColwiseParallel]) -> dict:
    """The reference plan with every column-wise projection split by `colwise` instead."""
    return {
        name: colwise() if isinstance(style, ColwiseParallel) else style
        for name, style in parallel.TENSOR_PARALLEL_PLAN.items()
    }


MLP_ONLY_PLAN = {"mlp_in": ColwiseParallel(), "mlp_out": RowwiseParallel()}
"""A valid plan of another shape: the MLP split, attention replicated on every tp rank."""


def parallelize_with(plan: dict):
    """The reference `parallelize` applying `plan` on the cell's tp dim."""

    def parallelize(model, cell, *, device, activation_checkpointing=False, mesh=None):
        return parallel.parallelize(
            model,
            cell,
            device=device,
            activation_checkpointing=activation_checkpointing,
            mesh=mesh,
            tensor_parallel_plan=plan,
        )

    return parallelize


parallelize_reducing_input_gradients_twice = parallelize_with(plan_with(InputGradientReducedTwice))
parallelize_reducing_input_gradients_over_world = parallelize_with(plan_with(InputGradientOverTheWorld))
parallelize_never_reducing_input_gradients = parallelize_with(plan_with(InputGradientNeverReduced))
parallelize_splitting_the_mlp_only = parallelize_with(MLP_ONLY_PLAN)
