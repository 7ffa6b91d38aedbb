"""How far two floating-point evaluations of the same sum can lie apart when nothing is known about
their order: Higham's bound |fl(x_1 + ... + x_n) - (x_1 + ... + x_n)| <= gamma_{n-1} * sum |x_i|,
gamma_k = k*u / (1 - k*u), for any order of the additions (Accuracy and Stability of Numerical
Algorithms, 2nd ed., section 4.2). The parallel_equivalence suite derives its tolerances here;
docs/explanation/parallel-equivalence.md walks through the derivation."""

from __future__ import annotations

from dataclasses import dataclass

UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11, "float64": 2.0**-53}
"""Half the gap between 1 and the next number of each dtype: the largest relative error of one rounding."""

NORM_NESTING = 6
"""Levels of square root and re-squaring a gradient norm may pass through on its way to one number
(per tensor, per rank's total, per mesh dimension, per group of meshes, ...), each one a square root,
a square and the pow a stack may use for either: four roundings per level, counted generously."""


def gamma(roundings: int, unit_roundoff: float) -> float:
    """gamma_k: the relative error bound of k successive roundings, (1 + d_1)...(1 + d_k) - 1."""
    if roundings * unit_roundoff >= 1:
        raise ValueError(
            f"{roundings} roundings at unit roundoff {unit_roundoff:.1e} leave no bound (k*u >= 1): "
            f"the model is too large for a worst-case bound; use a smaller one for this suite"
        )
    return roundings * unit_roundoff / (1 - roundings * unit_roundoff)


def is_power_of_two(number: int) -> bool:
    return number > 0 and number & (number - 1) == 0


@dataclass(frozen=True)
class MeanReduction:
    """The data-parallel mean of `terms` shard gradients, computed two ways: the parallel run casts
    each shard's gradient to `reduce_dtype` (where that is narrower), sums them in an order its
    collectives choose and divides by `terms` (FSDP splits the division into a pre- and a
    post-divide); the single-process reference sums them in order in `grad_dtype` and divides once.
    """

    terms: int
    reduce_dtype: str
    grad_dtype: str = "float32"

    @property
    def narrows(self) -> bool:
        return UNIT_ROUNDOFF[self.reduce_dtype] > UNIT_ROUNDOFF[self.grad_dtype]

    @property
    def exact(self) -> bool:
        """Bit for bit: one or two terms leave one possible sum (a + b == b + a), a power-of-two
        division is exact, and nothing is cast. Assumes no gradient is subnormal (below 2**-126)."""
        return self.terms <= 2 and not self.narrows

    @property
    def parallel_roundings(self) -> int:
        """A cast, terms - 1 additions, and two divisions where the world size is no power of two."""
        return int(self.narrows) + self.terms - 1 + (0 if is_power_of_two(self.terms) else 2)

    @property
    def reference_roundings(self) -> int:
        return self.terms - 1 + (0 if is_power_of_two(self.terms) else 1)

    @property
    def relative_bound(self) -> float:
        """The tolerance per element, as a multiple of sum_d |g_d| / terms: 0 where the mean is exact."""
        if self.exact:
            return 0.0
        return gamma(self.parallel_roundings, UNIT_ROUNDOFF[self.reduce_dtype]) + gamma(
            self.reference_roundings, UNIT_ROUNDOFF[self.grad_dtype]
        )

    def describe(self) -> str:
        """The tolerance as a failure message and the `precision` property show it."""
        over = f"mean of {self.terms} shard gradient{'s' if self.terms > 1 else ''} reduced in {self.reduce_dtype}"
        if self.exact:
            return f"{over}: bit for bit (at most two terms, no cast)"
        return (
            f"{over}: |parallel - single-process| <= {self.relative_bound:.3e} x sum_d |g_d| / {self.terms} per element "
            f"(gamma_{self.parallel_roundings} at u={UNIT_ROUNDOFF[self.reduce_dtype]:.1e} + "
            f"gamma_{self.reference_roundings} at u={UNIT_ROUNDOFF[self.grad_dtype]:.1e})"
        )


def norm_relative_bound(elements: int, dtype: str = "float32") -> float:
    """How far a 2-norm of `elements` values computed in `dtype`, in any order and nesting, may lie
    from the exact norm, relative to it: every leaf's path through the sum has one square, at most
    elements - 1 additions and NORM_NESTING levels of root and square, all of positive terms, then the
    final root; plus the float64 norm the suite compares with, computed the same way."""
    return gamma(elements + 1 + 4 * NORM_NESTING, UNIT_ROUNDOFF[dtype]) + gamma(elements + 1, UNIT_ROUNDOFF["float64"])


def clip_relative_bound(elements: int, dtype: str = "float32") -> float:
    """How far a clipped gradient element may lie from g * min(1, max_norm / (||g|| + 1e-6)) with the
    exact norm, relative to that value: the norm's error passes into the coefficient at most doubled
    (1/(1 - x) <= 1 + 2x for x <= 1/2), then the coefficient's addition, division and max_norm's cast
    to `dtype`, and the product, round once each."""
    return 2 * norm_relative_bound(elements, dtype) + gamma(4, UNIT_ROUNDOFF[dtype])
