"""What parallel_equivalence compares at each step, as plain functions of the two sides' tensors:
the reduced gradient against the single-process mean, the reduction's dtype grid, the clipping, the
parameters; each returns the problem lines a failure message lists."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from torchmatrix.testing import bits_equal

from .differences import tensor_difference
from .summation_bounds import MeanReduction
from .ulp import ulp_distance

NARROWER = {"float32": ("bfloat16", "float16"), "bfloat16": (), "float16": ()}
GRID_EVIDENCE = 16
"""Nonzero elements of one gradient that must all lie on a narrower dtype's grid before the suite
concludes it was reduced there: an fp32 sum lands on bf16's grid by chance about once in 2**16, so
16 such elements happen by chance about once in 2**256."""


@dataclass(frozen=True)
class GradientComparison:
    """The reduced gradient against the single-process mean: what lies outside its bound, and the
    figures a passing cell records."""

    problems: list[str]
    max_abs: float
    max_ulp: int
    max_ratio: float
    bound_norm: float
    """The 2-norm of the bound over every element: how far the two gradients' norms may lie apart."""


@dataclass(frozen=True)
class ClipComparison:
    """The clipped gradient against the reduced one times the whole norm's coefficient."""

    problems: list[str]
    coefficient: float
    max_ratio: float


def exact_norm(gradients: dict[str, torch.Tensor]) -> float:
    """The 2-norm of every element of every gradient, in float64 (the suite's stand-in for the exact norm)."""
    if not gradients:
        return 0.0
    return torch.linalg.vector_norm(torch.cat([g.detach().double().flatten().cpu() for g in gradients.values()])).item()


def missing_gradients(parallel: dict, reference: dict) -> list[str]:
    """One line per parameter that has a gradient on one side only."""
    return [
        f"{name}: no gradient in the parallel run, one in the single-process run"
        for name in sorted(reference.keys() - parallel.keys())
    ] + [
        f"{name}: a gradient in the parallel run, none in the single-process run"
        for name in sorted(parallel.keys() - reference.keys())
    ]


def gradient_comparison(
    parallel: dict, reference: dict, magnitude: dict, reduction: MeanReduction
) -> GradientComparison:
    """Per gradient, whether the parallel one lies within the reduction bound of the reference's mean;
    the largest difference, ULP distance and difference-to-bound ratio over all of them, and the 2-norm
    of the bound over every element (how far the two gradients' norms may lie apart)."""
    problems = missing_gradients(parallel, reference)
    if not reference:
        problems.append("the single-process run has no gradient: nothing to compare")
    max_abs, max_ulp, max_ratio, bound_squares = 0.0, 0, 0.0, 0.0
    for name in sorted(parallel.keys() & reference.keys()):
        actual, expected = parallel[name].cpu(), reference[name].cpu()
        if actual.shape != expected.shape:
            problems.append(f"{name}: shape {tuple(actual.shape)}, single-process {tuple(expected.shape)}")
            continue
        difference = (actual.double() - expected.double()).abs()
        max_abs = max(max_abs, difference.max().item() if difference.numel() else 0.0)
        if reduction.exact:
            ulps = ulp_distance(actual, expected)
            max_ulp = max(max_ulp, ulps)
            if not bits_equal(actual, expected):
                problems.append(
                    f"{name}: {tensor_difference(actual, expected, 'single-process')} (bound: 0, bit for bit)"
                )
            continue
        bound = reduction.relative_bound * magnitude[name].cpu() / reduction.terms
        bound_squares += float(bound.square().sum())
        over = difference > bound
        ratio = difference / bound.clamp_min(torch.finfo(torch.float64).tiny)
        max_ratio = max(max_ratio, ratio.max().item() if ratio.numel() else 0.0)
        if over.any():
            worst = int(ratio.flatten().argmax())
            problems.append(
                f"{name}: {int(over.sum())}/{over.numel()} elements over the bound; worst |diff| "
                f"{difference.flatten()[worst].item():.3e} where the bound is {bound.flatten()[worst].item():.3e} "
                f"({ratio.flatten()[worst].item():.3g}x)"
            )
    return GradientComparison(problems, max_abs, max_ulp, max_ratio, bound_squares**0.5)


def narrow_grid_lines(gradients: dict, declared: str) -> list[str]:
    """One line per gradient whose nonzero elements (at least GRID_EVIDENCE of them) all lie on the grid
    of a dtype narrower than `declared`: values only a sum in that dtype produces."""
    lines = []
    for name in sorted(gradients):
        gradient = gradients[name].cpu()
        nonzero = gradient[gradient != 0]
        if nonzero.numel() < GRID_EVIDENCE:
            continue
        for narrow in NARROWER[declared]:
            if torch.equal(nonzero.to(getattr(torch, narrow)).to(nonzero.dtype), nonzero):
                lines.append(f"{name}: all {nonzero.numel()} nonzero elements lie on the {narrow} grid")
                break
    return lines


def clip_comparison(reduced: dict, clipped: dict, coefficient: float, relative_bound: float) -> ClipComparison:
    """Per gradient, whether the clipped one equals the reduced one times `coefficient` within the
    relative bound; the largest difference-to-bound ratio."""
    problems = [f"{name}: the clip dropped this gradient" for name in sorted(reduced.keys() - clipped.keys())]
    max_ratio = 0.0
    for name in sorted(reduced.keys() & clipped.keys()):
        expected = reduced[name].cpu().double() * coefficient
        difference = (clipped[name].cpu().double() - expected).abs()
        bound = relative_bound * expected.abs()
        ratio = difference / bound.clamp_min(torch.finfo(torch.float64).tiny)
        max_ratio = max(max_ratio, ratio.max().item() if ratio.numel() else 0.0)
        over = difference > bound
        if over.any():
            worst = int(ratio.flatten().argmax())
            actual = clipped[name].cpu().double().flatten()[worst].item()
            unclipped = reduced[name].cpu().double().flatten()[worst].item()
            problems.append(
                f"{name}: {int(over.sum())}/{over.numel()} elements off; e.g. {unclipped:.6e} clipped to {actual:.6e} "
                f"(x{actual / unclipped if unclipped else float('nan'):.6f}), expected x{coefficient:.6f}"
            )
    return ClipComparison(problems, coefficient, max_ratio)


def parameter_differences(parallel: dict, reference: dict) -> list[str]:
    """Per parameter: missing on one side, or not bit-identical (how many elements, by how much)."""
    if not reference:
        return ["the single-process model has no parameters: nothing to compare"]
    problems = [f"{name}: only in the single-process model" for name in sorted(reference.keys() - parallel.keys())]
    problems += [f"{name}: only in the parallel model" for name in sorted(parallel.keys() - reference.keys())]
    return problems + [
        f"{name}: {difference}"
        for name in sorted(parallel.keys() & reference.keys())
        if (difference := tensor_difference(parallel[name].cpu(), reference[name].cpu(), "single-process"))
    ]
