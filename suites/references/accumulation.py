"""parallel_equivalence under gradient accumulation (axis `accumulation`): each rank runs `micro_batches`
micro-batches of its shard, all but the last with gradient sync off, then one synced backward; the
single-process reference computes the concatenated batch's gradient micro-batch by micro-batch in its
own world, and names what a gradient that went wrong holds instead (docs/explanation/parallel-equivalence.md)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from functools import partial

import torch
from torch.distributed.tensor import DTensor

from torchmatrix.components.accumulation_axis import param_dtype_of
from torchmatrix.testing import (
    ParallelEquivalenceOptions,
    UnavailableImplementation,
    call_accepting,
    load,
    wrapper_chain,
)

from ..comparison.differences import tensor_difference
from ..comparison.step_comparisons import gradient_comparison
from ..comparison.summation_bounds import MeanReduction
from ..state.built_names import named_parameters_as_built
from .single_process_reference import SingleProcessReference

DEFAULT_NO_SYNC = "torchmatrix.suites.references.accumulation:gradient_sync_off"
NO_SWITCH = (
    "this torch's FSDP2 module has no set_requires_gradient_sync, so gradient sync cannot be turned off for "
    "micro-batches; the accumulation cells need a release that has it"
)
UNDER_TENSOR_PARALLELISM = (
    "accumulation under tensor parallelism: the loss's first-order bound is derived per batch, not per micro-batch "
    "(run accumulation cells on a mesh without a tp dim)"
)


@contextmanager
def gradient_sync_off(model):
    """Component `no_sync`'s default: the wrapper's own switch, feature-detected on the wrapper chain
    (components/wrapper_chain.py), so a backward under it leaves the gradients unreduced (FSDP2's
    `set_requires_gradient_sync` on the user's model, FSDP1's and DDP's `no_sync()` wherever they sit)."""
    chain = wrapper_chain(model)
    switch = getattr(chain[-1], "set_requires_gradient_sync", None)
    syncing = next((module for module in chain if hasattr(type(module), "no_sync")), None)
    if switch is not None:
        switch(False)
        try:
            yield
        finally:
            switch(True)
    elif syncing is not None:
        with syncing.no_sync():
            yield
    elif any(isinstance(param, DTensor) for param in model.parameters()):
        raise UnavailableImplementation(NO_SWITCH)
    else:
        yield  # one process: nothing to sync


def sync_switch(components: dict, model, cell: dict) -> Callable:
    """`[components] no_sync` (or the default) bound to the cell's model (and the cell, where its
    signature names it): a context manager per call."""
    return partial(call_accepting, load(components.get("no_sync", DEFAULT_NO_SYNC)), model, cell=cell)


def micro_batch_seeds(options: ParallelEquivalenceOptions, shards: int, step: int, shard: int) -> list[int]:
    """The seeds of shard `shard`'s micro-batches at step `step`, the same on both sides."""
    first = options.batch_seed + (step * shards + shard) * options.micro_batches
    return list(range(first, first + options.micro_batches))


def accumulated_backward(training, batches: list, no_sync: Callable) -> torch.Tensor:
    """The cell's step on its micro-batches: each loss divided by their count, as a trainer scales it, and
    backpropagated, all but the last under `no_sync`; the step's loss is the scaled losses' sum in order."""
    total = torch.zeros((), dtype=torch.float32)
    for index, batch in enumerate(batches):
        with nullcontext() if index == len(batches) - 1 else no_sync():
            loss = training.loss(batch) / len(batches)
            training.backward(loss)
        total = total + loss.detach().float().cpu()
    return total


@contextmanager
def computing_in(model, dtype: torch.dtype):
    """The model's parameters cast to `dtype` for a forward and backward, as FSDP2 gathers them under
    `param_dtype` (buffers keep their dtype, as the policy leaves them); their values come back after.
    Where this release's FSDP2 gives the gathered parameters the reduce dtype as their `grad_dtype`, so
    each op produces its gradient in float32 instead of rounding it to `dtype` first, they get it too."""
    kept = [(param, param.data) for param in model.parameters()]
    for param, data in kept:
        param.data = data.to(dtype)
        if dtype != torch.float32 and gradients_made_in_reduce_dtype():
            param.grad_dtype = torch.float32
    try:
        yield
    finally:
        for param, data in kept:
            param.grad = None
            param.data = data


def gradients_made_in_reduce_dtype() -> bool:
    """Whether this release's FSDP2 sets its unsharded parameters' `grad_dtype` to the policy's
    reduce dtype (2.15.0 does; 2.13 and 2.14 round each gradient to the param dtype, then cast it)."""
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    return hasattr(FSDPParam, "unsharded_grad_dtype")


class AccumulatingReference(SingleProcessReference):
    """The single-process reference of a cell that accumulates: per shard, every micro-batch forward and
    backward with the parameters in the cell's param dtype, their gradients summed in float32 in
    micro-batch order (as a rank accumulates them with sync off), then the shards' mean as before."""

    def __init__(self, cell: dict, options: ParallelEquivalenceOptions, components: dict, shards: int):
        if shards < int(cell.get("world_size", 1)):
            raise UnavailableImplementation(UNDER_TENSOR_PARALLELISM)
        super().__init__(cell, options, components, shards)
        self.compute_dtype = getattr(torch, param_dtype_of(cell))
        self.micro: list[list[dict[str, torch.Tensor]]] = []

    def gradient(self, step: int) -> tuple[dict, dict, list]:
        """The concatenated batch's mean gradient (each shard's micro-batches summed in float32, the shards
        summed in order, divided once), sum_d |A_d| in float64, each shard's scaled loss sum."""
        self.micro = []
        total: dict[str, torch.Tensor] = {}
        magnitude: dict[str, torch.Tensor] = {}
        losses = []
        for shard in range(self.shards):
            gradients, loss = self.micro_batches(step, shard)
            self.micro.append(gradients)
            losses.append(loss)
            for name, accumulated in accumulate(gradients, torch.float32).items():
                total[name] = total[name] + accumulated if name in total else accumulated
                magnitude[name] = magnitude.get(name, 0) + accumulated.double().abs()
        return {name: value / self.shards for name, value in total.items()}, magnitude, losses

    def micro_batches(self, step: int, shard: int) -> tuple[list[dict[str, torch.Tensor]], torch.Tensor]:
        """Each micro-batch's gradient of its scaled loss, in the compute dtype, and the scaled losses' sum."""
        gradients, total = [], torch.zeros((), dtype=torch.float32)
        seeds = micro_batch_seeds(self.options, self.shards, step, shard)
        for seed in seeds:
            self.model.zero_grad(set_to_none=True)
            with computing_in(self.model, self.compute_dtype):
                batch = self.make_batch(self.model, seed=seed, device=self.device)
                loss = self.training.loss(batch) / len(seeds)
                self.training.backward(loss)
                gradients.append(
                    {
                        name: param.grad.detach().cpu().clone()
                        for name, param in named_parameters_as_built(self.model)
                        if param.grad is not None
                    }
                )
            total = total + loss.detach().float().cpu()
        return gradients, total

    def micro_batch_lines(self, reduced: dict, reduction: MeanReduction) -> list[str]:
        """One line per gradient of the cell that is not the concatenated batch's within the reduction
        bound, naming what it holds instead where one of the known accumulation faults explains it."""
        faults = accumulation_faults(self.micro, self.compute_dtype)
        expected = mean_over_shards([accumulate(gradients, torch.float32) for gradients in self.micro])
        magnitude = {
            name: sum(accumulate(gradients, torch.float32)[name].double().abs() for gradients in self.micro)
            for name in expected
        }
        lines, count = [], len(self.micro[0])
        for name in sorted(reduced.keys() & expected.keys()):
            if within(reduced[name], expected[name], magnitude[name], reduction):
                continue
            causes = [
                cause for cause, held in faults.items() if within(reduced[name], held[name], magnitude[name], reduction)
            ]
            lines.append(f"{name}: {causes[0] if causes else unexplained(reduced[name], expected[name], count)}")
        return lines


def accumulate(gradients: list[dict[str, torch.Tensor]], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Micro-batch gradients summed in order in `dtype`, each cast to it first (a parameter that got no
    gradient in a micro-batch adds nothing there)."""
    total: dict[str, torch.Tensor] = {}
    for gradient in gradients:
        for name, value in gradient.items():
            total[name] = total[name] + value.to(dtype) if name in total else value.to(dtype)
    return {name: value.float() for name, value in total.items()}


def mean_over_shards(per_shard: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The shards' gradients summed in shard order and divided once, in float32 (the reduce dtype)."""
    total: dict[str, torch.Tensor] = {}
    for gradients in per_shard:
        for name, value in gradients.items():
            total[name] = total[name] + value if name in total else value.clone()
    return {name: value / len(per_shard) for name, value in total.items()}


def accumulation_faults(micro: list[list[dict]], compute_dtype: torch.dtype) -> dict[str, dict[str, torch.Tensor]]:
    """What the reduced gradient would hold under each known accumulation fault, by its description."""
    count = len(micro[0])
    faults = {
        f"gradient holds only the last micro-batch's contribution (micro-batch {count - 1} of 0..{count - 1}): "
        f"what micro-batches 0..{count - 2} accumulated was dropped": mean_over_shards(
            [accumulate(gradients[-1:], torch.float32) for gradients in micro]
        ),
        "gradient was reduced after every micro-batch, not once: sync was on during micro-batches "
        f"0..{count - 2} (a no_sync that is a no-op, as FSDP1's no_sync() path is under FSDP2)": accumulate(
            [reduced_alone(micro, index) for index in range(count)], torch.float32
        ),
    }
    if compute_dtype != torch.float32:
        name = str(compute_dtype).removeprefix("torch.")
        faults[
            f"micro-batches were accumulated in {name}, not float32: the parameter's gradient dtype was dropped "
            f"(pytorch#170648), so updates below {name}'s resolution were lost"
        ] = mean_over_shards([accumulate(gradients, compute_dtype) for gradients in micro])
    return faults


def reduced_alone(micro: list[list[dict]], index: int) -> dict[str, torch.Tensor]:
    """Micro-batch `index`'s mean over the shards, each shard's gradient cast to float32 first (the reduce dtype)."""
    return mean_over_shards([accumulate([gradients[index]], torch.float32) for gradients in micro])


def within(actual: torch.Tensor, expected: torch.Tensor, magnitude: torch.Tensor, reduction: MeanReduction) -> bool:
    """Whether `actual` is `expected` within the reduction bound, as the gradient test judges it
    (step_comparisons.gradient_comparison): bit for bit where that is exact."""
    return not gradient_comparison({"g": actual}, {"g": expected}, {"g": magnitude}, reduction).problems


def unexplained(actual: torch.Tensor, expected: torch.Tensor, count: int) -> str:
    """The line for a gradient no known fault explains: by how much it differs."""
    difference = tensor_difference(actual, expected, "accumulated")
    return (
        f"not the {count} micro-batches' float32 accumulation ({difference}); no known accumulation fault explains it"
    )
