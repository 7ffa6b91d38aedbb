"""What parallel_equivalence compares a tensor-parallel cell's gathered gradient with: linear
functionals of it against the single-process mean's, each within its own first-order bound
(suites/comparison/reordered_sums.py). An element-wise bound would take a second backward per element; a
functional takes one. Per tensor, the reference's sign pattern (on the reference it is ‖g‖₁: a
gradient reduced twice doubles it, one never reduced loses a part of it); over every tensor, a fixed
random ±1 direction (a gradient wrong in its pattern yet as large) and the reference's unit direction,
whose bound is how far the gradient's norm may move to first order."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .step_comparisons import GradientComparison, missing_gradients
from .summation_bounds import MeanReduction

RANDOM_DIRECTION_SEED = 56
NORM_DIRECTION = "the single-process gradient's unit direction"


@dataclass(frozen=True)
class Functional:
    """φ(g) = Σ_p <directions[p], g_p> over the parameters it names, and what to call it in a message."""

    name: str
    directions: dict[str, torch.Tensor]

    def of(self, gradients: dict[str, torch.Tensor]) -> float:
        """φ of `gradients`, in float64; a parameter without a gradient contributes nothing."""
        return sum(
            float((direction.double() * gradients[name].cpu().double()).sum())
            for name, direction in self.directions.items()
            if name in gradients
        )


def functionals_of(mean: dict[str, torch.Tensor]) -> list[Functional]:
    """The functionals for one step, from the reference's mean gradient alone: one per tensor, the
    random direction, and the unit direction last (the norm check reads its bound)."""
    generator = torch.Generator().manual_seed(RANDOM_DIRECTION_SEED)
    norm = torch.linalg.vector_norm(torch.cat([g.double().flatten() for g in mean.values()])).item() or 1.0
    per_tensor = [Functional(f"{name} (its sign pattern)", {name: torch.sign(g)}) for name, g in sorted(mean.items())]
    random = {
        name: torch.randint(0, 2, g.shape, generator=generator).mul(2).sub(1).to(g.dtype)
        for name, g in sorted(mean.items())
    }
    unit = {name: g.double() / norm for name, g in mean.items()}
    return [*per_tensor, Functional("every gradient (a random ±1 direction)", random), Functional(NORM_DIRECTION, unit)]


def reduction_bound(functional: Functional, magnitude: dict[str, torch.Tensor], reduction: MeanReduction) -> float:
    """How far φ may move because the data-parallel mean sums its shards in another order: the
    reduction's element bound weighted by |direction| (zero where the mean is exact)."""
    if reduction.exact:
        return 0.0
    return sum(
        float((direction.double().abs() * reduction.relative_bound * magnitude[name] / reduction.terms).sum())
        for name, direction in functional.directions.items()
        if name in magnitude
    )


def functional_comparison(
    parallel: dict, mean: dict, functionals: list[Functional], bounds: list[float]
) -> GradientComparison:
    """Per functional, whether the parallel gradient's value lies within its bound of the mean's; the
    largest difference-to-bound ratio, and the unit direction's bound (how far the norms may lie apart)."""
    problems = missing_gradients(parallel, mean)
    problems += [
        f"{name}: shape {tuple(parallel[name].shape)}, single-process {tuple(mean[name].shape)}"
        for name in sorted(parallel.keys() & mean.keys())
        if parallel[name].shape != mean[name].shape
    ]
    if problems:  # a functional weighs every element of the reference's shapes: nothing more to evaluate
        return GradientComparison(problems, max_abs=0.0, max_ulp=0, max_ratio=0.0, bound_norm=bounds[-1])
    max_ratio, max_abs = 0.0, 0.0
    for functional, bound in zip(functionals, bounds, strict=True):
        actual, expected = functional.of(parallel), functional.of(mean)
        difference = abs(actual - expected)
        ratio = difference / max(bound, torch.finfo(torch.float64).tiny)
        max_ratio, max_abs = max(max_ratio, ratio), max(max_abs, difference)
        if difference > bound:
            problems.append(
                f"{functional.name}: {actual:.6e} where the single-process mean gives {expected:.6e}: "
                f"|diff| {difference:.3e}, first-order bound {bound:.3e} ({ratio:.3g}x)"
            )
    return GradientComparison(problems, max_abs=max_abs, max_ulp=0, max_ratio=max_ratio, bound_norm=bounds[-1])
