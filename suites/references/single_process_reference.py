"""parallel_equivalence's single-process reference: the cell's model built again from the same seed,
without parallelism and without compiling, in a world of one rank of its own, so a component that
reads the world's size or rank, or builds a mesh over it, sees the single process it stands for."""

from __future__ import annotations

from functools import partial

import torch

from torchmatrix.components.compile_axis import COMPILE_AXIS, NOT_COMPILED
from torchmatrix.components.pipeline_axis import NO_PIPELINE, PIPELINE_AXIS
from torchmatrix.testing import (
    ParallelEquivalenceOptions,
    build_optimizer,
    call_accepting,
    current_device,
    implementation_of,
    load,
    user_model,
)

from ..comparison.gradient_functionals import Functional
from ..comparison.reordered_sums import reordering_bounds
from ..components.training_step import build_training_step
from ..state.built_names import module_names, named_parameters_as_built, remember_built

DEFAULT_CLIP = "torchmatrix.suites.components.gradient_clipping:clip_grad_norm"


def reference_cell(cell: dict) -> dict:
    """The cell without parallelism, pipelining and compiling: what `parallelize` wraps the reference for
    and its clip and training step see. The model factory still gets the cell itself, which may size the
    model by it."""
    plain = {**cell, "fsdp": "none", "mesh": "flat", "world_size": 1}
    if COMPILE_AXIS in cell:
        plain[COMPILE_AXIS] = NOT_COMPILED
    if PIPELINE_AXIS in cell:
        plain[PIPELINE_AXIS] = NO_PIPELINE
    return plain


def seeded_model(cell: dict, options: ParallelEquivalenceOptions, components: dict):
    """The cell's `model` from the suite's seed: both sides start from the same weights."""
    torch.manual_seed(options.seed)
    return load(components["model"])(cell, dtype=torch.float32, dropout=0.0)


def batch_seed(options: ParallelEquivalenceOptions, shards: int, step: int, shard: int) -> int:
    """The seed of shard `shard` of step `step`'s global batch, the same on both sides."""
    return options.batch_seed + step * shards + shard


def optimizer_hyperparameters(cell: dict, options: ParallelEquivalenceOptions) -> dict:
    """What both sides build the cell's `optimizer_<optimizer>` with."""
    return dict(
        lr=options.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=options.weight_decay,
        implementation=implementation_of(cell),
    )


class SingleProcessReference:
    """One process training on every shard of each global batch, one after another, with the cell's
    components; it computes the mean gradient, its own clip and its own losses, and steps its
    optimizer in lockstep with the cell."""

    def __init__(self, cell: dict, options: ParallelEquivalenceOptions, components: dict, shards: int):
        self.cell = cell
        self.plain = reference_cell(cell)
        self.options = options
        self.shards = shards
        self.device = current_device()
        self.make_batch = load(components["batch"])
        self.clip = load(components.get("clip_grad_norm", DEFAULT_CLIP))
        built = seeded_model(cell, options, components)
        names = module_names(built)  # before parallelize: a compiled block's names gain `_orig_mod.` there
        self.model = remember_built(load(components["parallelize"])(built, self.plain, device=self.device), names)
        factory = load(components[f"optimizer_{cell['optimizer']}"])
        self.optimizer = build_optimizer(factory, self.model, **optimizer_hyperparameters(cell, options))
        self.training = build_training_step(components, model=self.model, optimizer=self.optimizer, cell=self.plain)

    def batch(self, step: int, shard: int):
        return self.make_batch(
            user_model(self.model), seed=batch_seed(self.options, self.shards, step, shard), device=self.device
        )

    def parameters(self) -> dict[str, torch.Tensor]:
        return {name: param.detach().cpu().clone() for name, param in named_parameters_as_built(self.model)}

    def gradient(self, step: int) -> tuple[dict, dict, list]:
        """Every shard of the step's global batch, one after another: their mean gradient (summed in
        shard order, divided once), sum_d |g_d| in float64, and their losses."""
        total: dict[str, torch.Tensor] = {}
        magnitude: dict[str, torch.Tensor] = {}
        losses = []
        for shard in range(self.shards):
            self.model.zero_grad(set_to_none=True)
            loss = self.training.loss(self.batch(step, shard))
            self.training.backward(loss)
            losses.append(loss.detach().float().cpu())
            for name, param in named_parameters_as_built(self.model):
                if param.grad is not None:
                    gradient = param.grad.detach().cpu()
                    total[name] = total[name] + gradient if name in total else gradient.clone()
                    magnitude[name] = magnitude.get(name, 0) + gradient.double().abs()
        self.model.zero_grad(set_to_none=True)
        return {name: value / self.shards for name, value in total.items()}, magnitude, losses

    def reordering_bounds(self, step: int, functionals: list[Functional]) -> tuple[list[float], list[float]]:
        """How far, to first order, each shard's loss and each functional of the mean gradient may move
        when the linear layers sum in another order (suites/comparison/reordered_sums.py), in a pass of its own
        that differentiates autograd's gradient of the loss once more (the stack's `backward` cannot)."""
        loss_bounds, totals = [], [0.0] * len(functionals)
        for shard in range(self.shards):
            self.model.zero_grad(set_to_none=True)
            loss_of_model = partial(self.training.loss, self.batch(step, shard))
            loss_bound, bounds = reordering_bounds(
                self.model, named_parameters_as_built(self.model), loss_of_model, functionals
            )
            loss_bounds.append(loss_bound)
            totals = [total + bound / self.shards for total, bound in zip(totals, bounds, strict=True)]
        self.model.zero_grad(set_to_none=True)
        return loss_bounds, totals

    def clip_norm(self, mean: dict, max_norm: float) -> float:
        """What the clip component returns here, in one process, for the model holding the mean gradient."""
        self.hold(mean)
        returned = float(call_accepting(self.clip, self.model, max_norm=max_norm, cell=self.plain))
        self.model.zero_grad(set_to_none=True)
        return returned

    def step_with(self, clipped: dict) -> None:
        """The optimizer's step fed `clipped`, the gradient the cell stepped with, so both sides start
        the next step from the same parameters (an Adam step would amplify any difference in its input)."""
        self.hold(clipped)
        self.training.optimizer_step()
        self.optimizer.zero_grad(set_to_none=True)

    def hold(self, gradients: dict) -> None:
        for name, param in named_parameters_as_built(self.model):
            param.grad = gradients[name].to(self.device).clone() if name in gradients else None
