"""How far two implementations of one AdamW step (for-loop, foreach, fused, compiled) may lie apart
per element, given the same parameter, gradient and moments: each computes the same formula with its
operations in another order or fused, so each result lies within Higham's gamma_k = k*u / (1 - k*u)
times the magnitude of its terms of the exact one, k the roundings on a term's path (Accuracy and
Stability of Numerical Algorithms, 2nd ed., section 3.1), and two of them within twice that.
docs/explanation/optimizer-implementations.md walks through the counts.

A scalar computed as 1 - b from a rounded b (a beta cast to float32, then 1 - beta, or a bias
correction 1 - beta**t) carries b's rounding amplified by its condition number b / (1 - b): it counts
as that many roundings. Hyper-parameters are assumed sane: 0 <= beta < 1, lr * weight_decay <= 1/2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .summation_bounds import UNIT_ROUNDOFF, gamma

SMALLEST_SPACING = {"float32": 2.0**-149, "bfloat16": 2.0**-133, "float16": 2.0**-24, "float64": 2.0**-1074}
"""The gap between subnormal numbers of each dtype: the absolute error of a rounding that underflows."""

BOUNDED_KEYS = ("param", "exp_avg", "exp_avg_sq")
"""The quantities an AdamW step changes that rounding may move; `step` must be equal exactly."""


def one_minus_roundings(b: float) -> float:
    """Roundings that 1 - b carries when b was rounded first: b's one rounding times b / (1 - b)."""
    return max(1.0, b / (1 - b))


def bias_correction_roundings(beta: float, step: int) -> float:
    """1 - beta**step computed from a rounded beta: beta**step carries step roundings from beta and one
    of its own (pow), amplified by the condition number of 1 - x; then the subtraction and a cast."""
    power = beta**step
    return power / (1 - power) * (step + 1) + 2


@dataclass(frozen=True)
class AdamWStep:
    """One AdamW step's hyper-parameters as the for-loop reference ran it: p <- p * (1 - lr * wd) -
    lr / bc1 * m' / (sqrt(v') / sqrt(bc2) + eps), m' = beta1 m + (1 - beta1) g, v' = beta2 v + (1 - beta2) g^2,
    bc = 1 - beta**step; `dtype` the one the parameter and its moments are stored and computed in."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    step: int
    dtype: str = "float32"

    @property
    def unit_roundoff(self) -> float:
        return UNIT_ROUNDOFF[self.dtype]

    def gamma(self, roundings: float) -> float:
        return gamma(roundings, self.unit_roundoff)

    @property
    def first_moment_roundings(self) -> float:
        """m' as torch's lerp m + w * (g - m): the weight w = 1 - beta1, g - m, the product, the sum."""
        return one_minus_roundings(self.beta1) + 3

    @property
    def second_moment_roundings(self) -> float:
        """v' = beta2 v + (1 - beta2) g^2, on the g^2 path (the longer): the weight, g * g, the product, the sum."""
        return one_minus_roundings(self.beta2) + 3

    @property
    def denominator_roundings(self) -> float:
        """sqrt(v') / sqrt(bc2) + eps, all terms positive: half of v''s and of bc2's roundings through
        each square root and one for each root, the division, the addition and eps's cast."""
        return (self.second_moment_roundings + bias_correction_roundings(self.beta2, self.step)) / 2 + 5

    @property
    def update_roundings(self) -> float:
        """lr / bc1 * m' / denominator, m' set aside: bc1's roundings, lr's cast and the quotient, the
        denominator's, and the division, product and reciprocal an implementation may take."""
        return bias_correction_roundings(self.beta1, self.step) + 2 + self.denominator_roundings + 3

    def exact(self, param, grad, exp_avg, exp_avg_sq) -> dict[str, torch.Tensor]:
        """The step in float64 from the stored inputs: the value each implementation approximates, and
        the terms it is made of (`update`: lr / bc1 * m' / denominator, `decay`: lr * wd * p, `reach`:
        lr / bc1 / denominator, which carries an error of m' into the update)."""
        p, g, m, v = (tensor.detach().to(torch.float64) for tensor in (param, grad, exp_avg, exp_avg_sq))
        new_m = self.beta1 * m + (1 - self.beta1) * g
        new_v = self.beta2 * v + (1 - self.beta2) * g * g
        denominator = new_v.sqrt() / (1 - self.beta2**self.step) ** 0.5 + self.eps
        reach = self.lr / (1 - self.beta1**self.step) / denominator
        update, decay = reach * new_m, self.lr * self.weight_decay * p
        return {
            "param": p - decay - update,
            "exp_avg": new_m,
            "exp_avg_sq": new_v,
            "update": update,
            "decay": decay,
            "reach": reach,
        }

    def bounds(self, param, grad, exp_avg, exp_avg_sq) -> dict[str, torch.Tensor]:
        """Per element of each of BOUNDED_KEYS, the most two implementations' results may differ
        (float64): twice the most either may lie from `exact`, plus a few underflowing roundings."""
        exact = self.exact(param, grad, exp_avg, exp_avg_sq)
        p, g, m = (tensor.detach().to(torch.float64).abs() for tensor in (param, grad, exp_avg))
        weight = 1 - self.beta1
        first_moment_error = self.gamma(self.first_moment_roundings) * ((1 + weight) * m + weight * g)
        update = exact["update"].abs()
        update_error = exact["reach"] * first_moment_error + self.gamma(self.update_roundings) * update
        decayed = p * (1 + self.lr * self.weight_decay)
        param_error = self.gamma(4) * decayed + update_error + self.unit_roundoff * (decayed + update)
        underflow = 4 * SMALLEST_SPACING[self.dtype]
        return {
            "param": 2 * (param_error + underflow),
            "exp_avg": 2 * (first_moment_error + underflow),
            "exp_avg_sq": 2 * (self.gamma(self.second_moment_roundings) * exact["exp_avg_sq"] + underflow),
        }

    def describe(self) -> str:
        """The bound as the failure message and the JUnit property show it."""
        return (
            f"AdamW step {self.step} in {self.dtype} (u={self.unit_roundoff:.1e}), per element |a - b| <= 2 x ("
            f"exp_avg: gamma_{self.first_moment_roundings:.0f} ((2 - beta1) |m| + (1 - beta1) |g|); "
            f"exp_avg_sq: gamma_{self.second_moment_roundings:.0f} v'; parameter: gamma_4 |p| (1 + lr wd) + "
            f"gamma_{self.update_roundings:.0f} |update| + exp_avg's error x lr / bc1 / denominator + u (|p| + |update|))"
        )
