"""Known-bad components for gradient accumulation (axis `accumulation`): each makes a cell's micro-batches
with gradient sync off, then one synced backward, hold another gradient than the concatenated batch's,
in the way a real stack or release did; suites/test_parallel_equivalence.py must name each by cause.

Point `[components] parallelize` or `no_sync` at one of these to see it caught.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext

from torch.distributed.fsdp import FSDPModule

from .. import parallel


def fsdp_params(model) -> Iterator:
    """Every FSDP2 parameter record (torch's FSDPParam) of the model's FSDP modules: where a release keeps
    the unsharded gradient it accumulates with sync off."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            for group in module._get_fsdp_state()._fsdp_param_groups:
                yield from group.fsdp_params


def parallelize_accumulating_in_param_dtype(model, cell, *, device, activation_checkpointing=False, mesh=None):
    """The reference parallelize whose FSDP2 parameters keep a sync-off micro-batch's gradient in the
    param dtype (bf16) instead of moving it to the float32 reduce dtype, so the micro-batches sum in bf16
    and updates below its resolution are lost: the class of pytorch#170648 (fully_shard dropping a
    parameter's grad_dtype)."""
    model = parallel.parallelize(
        model, cell, device=device, activation_checkpointing=activation_checkpointing, mesh=mesh
    )
    for fsdp_param in fsdp_params(model):
        fsdp_param.to_accumulated_grad_if_needed = lambda: None
    return model


def parallelize_keeping_the_last_micro_batch(model, cell, *, device, activation_checkpointing=False, mesh=None):
    """The reference parallelize whose FSDP2 parameters, when the synced micro-batch brings a gradient,
    replace what the earlier micro-batches accumulated with it instead of adding it: the gradient holds the
    last micro-batch only (the class of pytorch#196996, #186998, where a parameter's first gradient on the
    last micro-batch decides what is reduced)."""
    model = parallel.parallelize(
        model, cell, device=device, activation_checkpointing=activation_checkpointing, mesh=mesh
    )
    for fsdp_param in fsdp_params(model):
        fsdp_param.accumulate_unsharded_grad_if_needed = dropping_what_accumulated(fsdp_param)
    return model


def dropping_what_accumulated(fsdp_param):
    """FSDPParam.accumulate_unsharded_grad_if_needed for this parameter, replacing instead of adding."""

    def accumulate_unsharded_grad_if_needed() -> None:
        if fsdp_param.unsharded_accumulated_grad is not None and fsdp_param.unsharded_param.grad is not None:
            fsdp_param.unsharded_accumulated_grad = None

    return accumulate_unsharded_grad_if_needed


def no_sync_where_the_model_has_one(model):
    """A `no_sync` written for FSDP1 and DDP, as accelerate's `no_sync` is: the model's own `no_sync()`,
    else nothing. An FSDP2 module has none, so every micro-batch is reduced and the switch is a silent no-op."""
    return getattr(model, "no_sync", nullcontext)()
