"""One training step of the cell's stack under torch's memory profiler: what the step held at its
highest, and each kind of tensor's own highest (parameters, optimizer state, gradients, activations,
temporaries), on this rank's device.

The profiler sees every allocation of the device's allocator, compiled kernels' and tensor subclasses'
included (torch's MemTracker, a dispatch mode, cannot build the reference model's causal-bias
subclass), and attributes each tensor to a kind from the autograd graph and the optimizer's state.
Sizes do not depend on the machine's load: two runs of one release give the same bytes of each attributed kind.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from torchmatrix.messages.properties import STEP_PEAK
from torchmatrix.testing import build_optimizer, current_device, data_parallel_rank, load

from ..components.parallelize_component import parallelized
from ..components.training_step import build_training_step
from ..references.single_process_reference import optimizer_hyperparameters, seeded_model

KINDS = {
    "PARAMETER": "parameters",
    "OPTIMIZER_STATE": "optimizer_state",
    "GRADIENT": "gradients",
    "ACTIVATION": "activations",
    "TEMPORARY": "temporaries",
    "INPUT": "inputs",
    "AUTOGRAD_DETAIL": "autograd_detail",
    None: "unattributed",
}
"""torch's memory categories, by the names the figures use (`step_peak_bytes/<kind>`)."""


def measured_step(cell: dict, options, components: dict) -> dict:
    """Rank function: `options.warmup_steps` steps of the cell's stack (its optimizer state then
    exists), then one more, under the profiler on rank 0: its highest total and each kind's highest, in
    bytes, or `unavailable` with the reason where this torch's profiler cannot attribute memory; {} on
    the other ranks, which hold as much or less (FSDP gives rank 0 an uneven shard's larger part) and
    whose profiles would cost most of the suite's time."""
    device = current_device()
    model = parallelized(
        components,
        seeded_model(cell, options, components),
        cell,
        device=device,
        activation_checkpointing=options.activation_checkpointing,
    )
    factory = load(components[f"optimizer_{cell['optimizer']}"])
    optimizer = build_optimizer(factory, model, **optimizer_hyperparameters(cell, options))
    training = build_training_step(components, model=model, optimizer=optimizer, cell=cell)
    make_batch = load(components["batch"])
    rank = data_parallel_rank(cell)
    model.train()

    def step(index: int) -> None:
        batch = make_batch(model, seed=options.batch_seed + 1000 * index + rank, device=device)
        training.backward(training.loss(batch))
        training.optimizer_step()
        optimizer.zero_grad(set_to_none=True)

    for index in range(options.warmup_steps):
        step(index)
    if dist.is_initialized() and dist.get_rank() != 0:
        step(options.warmup_steps)
        return {}
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as run:
        step(options.warmup_steps)
    return highest_by_kind(run, device)


def highest_by_kind(run, device: torch.device) -> dict:
    """The profiled step's highest total on `device` and each kind's own highest, from the timeline
    torch's (deprecated, private) `export_memory_timeline` draws; `unavailable` where it is missing."""
    try:
        from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

        _, sizes = MemoryProfileTimeline(run._memory_profile())._coalesce_timeline(str(device))
    except (ImportError, AttributeError, TypeError, RuntimeError, AssertionError) as error:
        # AssertionError: the profiler's own data-flow check ("version mismatch") on some eager-attention
        # FSDP2 steps of torch 2.13.0; its memory timeline is deprecated there and not maintained.
        cause = f"{type(error).__name__}: {error}".splitlines()[0][:200]
        return {
            "unavailable": f"torch {torch.__version__}'s memory profiler cannot attribute this step's memory ({cause})"
        }
    if not sizes:
        return {"unavailable": f"the profiler recorded no allocation on {device}"}
    columns = {
        KINDS.get(getattr(category, "name", None), "unattributed"): index + 1
        for category, index in _CATEGORY_TO_INDEX.items()
    }
    totals = [sum(row) for row in sizes]
    return {
        STEP_PEAK: max(totals),
        "kinds": {kind: max(row[column] for row in sizes) for kind, column in columns.items()},
    }
