"""parallel_equivalence's training, in three passes over two worlds: the single-process reference
opens in a world of one rank of its own (its first gradient sets `max_norm`), the cell trains in its
own world as it would alone and writes what it computed, then the reference trains again beside
those records, step by step, and compares. Neither side ever runs in the other's world."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from torchmatrix.components.accumulation_axis import accumulates
from torchmatrix.components.pipeline_axis import pipelines
from torchmatrix.testing import ParallelEquivalenceOptions, UnavailableImplementation, data_parallel_size

from ..comparison.deterministic import deterministic_algorithms
from ..comparison.gradient_functionals import functional_comparison, functionals_of, reduction_bound
from ..comparison.step_comparisons import (
    GRID_EVIDENCE,
    GradientComparison,
    clip_comparison,
    exact_norm,
    gradient_comparison,
    narrow_grid_lines,
    parameter_differences,
)
from ..comparison.summation_bounds import MeanReduction, clip_relative_bound, norm_relative_bound
from ..comparison.ulp import ulp_distance
from .accumulation import AccumulatingReference
from .cell_training import CELL_STEPS, CellTraining, train_and_record
from .lockstep_steps import LockstepRecord, LockstepStep, LockstepUnavailable, NormComparison
from .pipelining import PipelinedReference, PipelinedTraining
from .single_process_reference import SingleProcessReference

OWN_WORLD = "a world of one rank of its own"
IN_THE_CELLS_WORLD = (
    "the cell's own world, on every rank ({why_not}): a component that reads the world's size or rank sees the "
    "cell's there too, so a division by it twice is not caught"
)
CLIP_EPSILON = 1e-6
"""What torch.nn.utils.clip_grad_norm_ adds to the norm before dividing max_norm by it."""


def lockstep_records(
    ranks, cell: dict, options: ParallelEquivalenceOptions, components: dict, directory
) -> list[LockstepRecord] | list[LockstepUnavailable]:
    """One record per rank of the cell: each step's loss, reduced gradient, norm, clipping and
    parameters against the single-process reference's; one `LockstepUnavailable` where the cell's
    optimizer implementation cannot be built here."""
    single, why_not = ranks.beside(1)
    where = OWN_WORLD if single is not None else IN_THE_CELLS_WORLD.format(why_not=why_not)
    single = single or ranks  # every rank of the cell then computes the same reference: no rank waits alone
    shards = data_parallel_size(cell)  # here, outside any world, from the cell's world_size and mesh
    opening = single.run(open_single_process, cell, options, components, shards)[0]
    if "unavailable" in opening:
        return [LockstepUnavailable(opening["unavailable"])]
    trained = ranks.run(train_cell, cell, options, components, opening["max_norm"], str(directory))
    if "unavailable" in trained[0]:
        return [LockstepUnavailable(trained[0]["unavailable"])]
    records = single.run(compare_in_lockstep, cell, options, components, opening["max_norm"], trained, str(directory))
    return [replace(record, reference_world=where) for record in records[0]]


# ---- in the reference's world of one rank -----------------------------------------------------


def open_single_process(cell: dict, options: ParallelEquivalenceOptions, components: dict, shards: int) -> dict:
    """The reference's first mean gradient sets `max_norm` (`clip_fraction` of its norm), so that the
    first step clips on both sides and a wrong norm changes the training."""
    with deterministic_algorithms():
        try:
            reference = reference_for(cell)(cell, options, components, shards)
        except UnavailableImplementation as unavailable:
            return {"unavailable": str(unavailable)}
        mean = reference.gradient(0)[0]
        return {"max_norm": options.clip_fraction * exact_norm(mean)}


def compare_in_lockstep(
    cell: dict, options: ParallelEquivalenceOptions, components: dict, max_norm: float, trained: list, directory: str
) -> list[LockstepRecord]:
    """The reference trains beside the cell's records and compares each step; its optimizer steps on
    the clipped gradient the cell stepped with once that gradient lay within its bound of the
    reference's own. Stops after the first step whose gradient or parameters differ: the reference
    never steps on a gradient it could not vouch for, and later steps would start elsewhere."""
    with deterministic_algorithms():
        shards, tensor_parallel = trained[0]["shards"], trained[0]["tensor_parallel"]
        reference = reference_for(cell)(cell, options, components, shards)
        recorded = torch.load(Path(directory) / CELL_STEPS, weights_only=True)
        reduction = MeanReduction(shards, options.reduce_dtype)
        initial = parameter_differences(recorded["initial"], reference.parameters())
        per_rank: list[list[LockstepStep]] = [[] for _ in trained]
        for index, computed in enumerate(recorded["steps"]):
            mean, magnitude, losses = reference.gradient(index)
            if tensor_parallel:
                functionals = functionals_of(mean)
                loss_bounds, bounds = reference.reordering_bounds(index, functionals)
                bounds = [
                    bound + reduction_bound(f, magnitude, reduction)
                    for f, bound in zip(functionals, bounds, strict=True)
                ]
                gradient = functional_comparison(computed["reduced"], mean, functionals, bounds)
            else:
                loss_bounds = [0.0] * shards
                gradient = gradient_comparison(computed["reduced"], mean, magnitude, reduction)
            shared = step_comparison(computed, mean, gradient, max_norm, options.reduce_dtype)
            shared["single_process_clip"] = reference.clip_norm(mean, max_norm)
            if accumulates(cell) or pipelines(cell):
                shared["micro_batches"] = reference.micro_batch_lines(computed["reduced"], reduction)
            vouched = not gradient.problems
            if vouched:  # the reference steps only on a gradient within its bound of its own
                reference.step_with(computed["clipped"])
            shared["parameters"] = (
                parameter_differences(computed["parameters"], reference.parameters()) if vouched else []
            )
            for rank, run in enumerate(trained):
                per_rank[rank].append(rank_comparison(shared, run, index, losses, loss_bounds))
            if not vouched or shared["parameters"]:
                break
        elements = per_rank[0][0].elements if per_rank[0] else 0
        return [
            LockstepRecord(
                shards=shards,
                tensor_parallel=tensor_parallel,
                initial_parameters=initial,
                steps=steps,
                elements=elements,
                max_norm=max_norm,
                norm_tolerance=norm_relative_bound(elements),
                clip_tolerance=clip_relative_bound(elements),
            )
            for steps in per_rank
        ]


def reference_for(cell: dict) -> type[SingleProcessReference]:
    """The single process that stands for the cell: one that accumulates micro-batches where the cell does,
    one that runs the pipeline's micro-batches through the whole model where the cell pipelines."""
    if pipelines(cell):
        return PipelinedReference
    return AccumulatingReference if accumulates(cell) else SingleProcessReference


def step_comparison(computed: dict, mean: dict, gradient: GradientComparison, max_norm: float, declared: str) -> dict:
    """What every rank of the cell shares at one step (the gathered tensors are the same on each):
    the gradient's comparison with the reference's mean gradient, both norms, and the clipping and
    dtype checks; compare_in_lockstep adds the rest of a `LockstepStep`'s shared fields."""
    reduced, clipped = computed["reduced"], computed["clipped"]
    exact = exact_norm(reduced)
    elements = sum(gradient.numel() for gradient in reduced.values())
    coefficient = min(1.0, max_norm / (exact + CLIP_EPSILON))
    return {
        "gradient": gradient,
        "narrow_grid": narrow_grid_lines(reduced, declared),
        "grid_checked": any(int(g.count_nonzero()) >= GRID_EVIDENCE for g in reduced.values()),
        "exact_norm": exact,
        "single_process_norm": exact_norm(mean),
        "clip": clip_comparison(reduced, clipped, coefficient, clip_relative_bound(elements)),
        "elements": elements,
        "micro_batches": [],
    }


def rank_comparison(shared: dict, run: dict, index: int, losses: list, loss_bounds: list) -> LockstepStep:
    """One rank's view of a step: its own loss against the reference's loss of its shard, the norm its
    clip returned against the gathered gradient's and the single-process mean's."""
    loss = torch.tensor(run["losses"][index], dtype=torch.float32)
    reference_loss = losses[run["shard"]]
    returned = run["norms"][index]
    exact, single = shared["exact_norm"], shared["single_process_norm"]
    gradient: GradientComparison = shared["gradient"]
    norm = NormComparison(
        returned=returned,
        exact=exact,
        single_process=single,
        single_process_clip=shared["single_process_clip"],
        relative_error=abs(returned - exact) / exact if exact else abs(returned),
        single_process_error=abs(returned - single),
        # |returned - ||mean||| <= the norm's own rounding + | ||reduced|| - ||mean|| |: the 2-norm of the element
        # bound, or under tensor parallelism the first-order bound of the unit direction's functional.
        single_process_tolerance=norm_relative_bound(shared["elements"]) * exact + gradient.bound_norm,
    )
    return LockstepStep(
        loss=loss.item(),
        reference_loss=reference_loss.item(),
        loss_ulp=ulp_distance(loss, reference_loss),
        loss_bound=loss_bounds[run["shard"]],
        gradient=gradient,
        norm=norm,
        clip=shared["clip"],
        narrow_grid=shared["narrow_grid"],
        grid_checked=shared["grid_checked"],
        elements=shared["elements"],
        parameters=shared["parameters"],
        micro_batches=shared["micro_batches"],
    )


# ---- in the cell's world ----------------------------------------------------------------------


def train_cell(cell: dict, options: ParallelEquivalenceOptions, components: dict, max_norm: float, directory: str):
    """Rank function: the cell trains `steps` steps as it would alone (pipelined where its `pipeline` is
    not none); every rank returns its losses and the norms its clip returned, and rank 0 writes the
    gathered gradients and parameters."""
    with deterministic_algorithms():
        try:
            training = (PipelinedTraining if pipelines(cell) else CellTraining)(cell, options, components)
        except UnavailableImplementation as unavailable:
            return {"unavailable": str(unavailable)}
        return train_and_record(training, max_norm, Path(directory) / CELL_STEPS)
