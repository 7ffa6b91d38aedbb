"""The parallel_equivalence suite's derived tolerances hold where they claim to and are tight enough
to mean something: sums of the same float32 terms in many orders stay within the mean-reduction
bound, a bfloat16 reduction breaks the float32 one, and norms in several nestings stay within the
norm bound while a shard's partial norm does not. No rank processes: the fast lane."""

from __future__ import annotations

import pytest
import torch

from torchmatrix.suites.comparison.summation_bounds import MeanReduction, gamma, norm_relative_bound

TERMS = 4
ELEMENTS = 4096


def shard_gradients(terms: int, seed: int = 0) -> torch.Tensor:
    """terms x ELEMENTS float32 values of mixed signs and magnitudes, as shard gradients are."""
    generator = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.randn(terms, ELEMENTS, generator=generator, dtype=torch.float64) * 3)
    return (torch.randn(terms, ELEMENTS, generator=generator, dtype=torch.float64) * scale).float()


def mean_in_order(gradients: torch.Tensor, order: list[int], dtype=torch.float32) -> torch.Tensor:
    """Cast to `dtype`, add the shards in `order`, divide by their count: one collective's way."""
    total = gradients[order[0]].to(dtype)
    for index in order[1:]:
        total = total + gradients[index].to(dtype)
    return (total / len(order)).float()


def test_two_terms_without_a_cast_are_exact_and_more_are_not_claimed_to_be():
    assert MeanReduction(1, "float32").exact and MeanReduction(2, "float32").exact
    assert not MeanReduction(2, "bfloat16").exact and not MeanReduction(4, "float32").exact
    assert MeanReduction(2, "float32").relative_bound == 0
    assert MeanReduction(4, "float32").relative_bound == pytest.approx(2 * gamma(3, 2.0**-24))
    assert MeanReduction(6, "float32").parallel_roundings == 5 + 2  # two divisions by a non-power of two


def test_any_order_of_four_float32_terms_stays_within_the_bound_and_two_are_bitwise_equal():
    gradients = shard_gradients(TERMS)
    reference = mean_in_order(gradients, list(range(TERMS)))
    bound = MeanReduction(TERMS, "float32").relative_bound * gradients.double().abs().sum(0) / TERMS
    orders = [[3, 2, 1, 0], [1, 3, 0, 2], [2, 0, 3, 1]]
    worst = 0.0
    for order in orders:
        difference = (mean_in_order(gradients, order).double() - reference.double()).abs()
        assert (difference <= bound).all(), order
        worst = max(worst, (difference / bound).max().item())
    pair = gradients[:2]
    assert torch.equal(mean_in_order(pair, [0, 1]), mean_in_order(pair, [1, 0]))
    assert worst > 0.05, f"the bound is {1 / worst:.0f}x the worst difference: too loose to catch a rounding change"


def test_a_bfloat16_reduction_breaks_the_declared_float32_bound():
    gradients = shard_gradients(TERMS)
    reference = mean_in_order(gradients, list(range(TERMS)))
    narrowed = mean_in_order(gradients, list(range(TERMS)), dtype=torch.bfloat16)
    magnitude = gradients.double().abs().sum(0) / TERMS
    difference = (narrowed.double() - reference.double()).abs()
    assert (difference > MeanReduction(TERMS, "float32").relative_bound * magnitude).float().mean() > 0.9
    assert (difference <= MeanReduction(TERMS, "bfloat16").relative_bound * magnitude).all()


def test_norms_in_any_nesting_stay_within_the_norm_bound_and_a_partial_norm_does_not():
    gradients = shard_gradients(TERMS).flatten()
    exact = torch.linalg.vector_norm(gradients.double()).item()
    flat = torch.linalg.vector_norm(gradients).item()
    per_shard = torch.stack([torch.linalg.vector_norm(chunk) for chunk in gradients.chunk(7)])
    nested = torch.linalg.vector_norm(per_shard).item()
    bound = norm_relative_bound(gradients.numel())
    for computed in (flat, nested):
        assert abs(computed - exact) <= bound * exact
    partial = torch.linalg.vector_norm(gradients[: gradients.numel() // 2]).item()
    assert abs(partial - exact) > bound * exact
