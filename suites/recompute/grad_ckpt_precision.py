"""How closely grad_ckpt compares a step with its twin: bit for bit in float32, within a derived
bound in bf16 or under a compiler that generates its own kernels, and the line that says what differs."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from torchmatrix.testing import (
    DTYPES,
    GradCkptOptions,
    bits_equal,
)

from ..comparison.differences import element_difference
from ..references.eager_twin import (
    KERNEL_KEEPING_BACKENDS,
)
from .compiled_rng import GRAPH_SAFE_RNG_OFF

# bfloat16 keeps 8 significant bits, eps = 2**-7. The suite's bf16 models accumulate matmuls
# and reductions in fp32 (as CPU and GPU bf16 kernels do), so a recompute that sums in another
# order differs there by ~K * 2**-24, far below bf16's resolution; what remains is each side's
# rounding to bf16, at most one ulp each, so the two may sit two ulps apart: rtol = 2 * eps.
# Where a gradient element cancelled to near zero a relative bound means nothing, so the
# absolute floor is the same two ulps at the tensor's own scale: atol = 2 * eps * max|expected|.
BF16_RTOL = 2 * 2**-7

# Under a compiler that generates its own kernels (inductor, or a backend of the user's), the two
# compiled steps may not run the same float32 kernels: the partitioner may fuse the recomputed
# forward ops into the backward's kernels, so a reduction of K terms may be summed in another order.
# Reordering K float32 terms moves the sum by at most (K - 1) * 2**-24 of the sum of their magnitudes;
# this bound allows K = 1024 (the reference decoder's longest reduction is 64 terms): rtol = 2**-14,
# with the absolute floor at the tensor's own scale as for bf16, since a cancelled element has no
# meaningful relative error. aot_eager (and eager) run torch's own kernels on the same inputs in
# both steps, so they stay bit for bit.
REORDER_RTOL = 2**10 * 2**-24


@dataclass(frozen=True)
class Precision:
    """The dtype the models run in and how close checkpointed gradients must be to the reference;
    ``compiler``: the compile backend, where it generates kernels of its own."""

    dtype: str
    compute: str | None = None
    compiler: str | None = None
    graph_safe_rng_off: bool = False

    @property
    def bf16(self) -> bool:
        return (self.compute or self.dtype) == "bfloat16"

    @property
    def exact(self) -> bool:
        return not self.bf16 and self.compiler is None

    @property
    def rtol(self) -> float:
        """The relative tolerance, which is also the absolute floor's fraction of max|expected|."""
        return BF16_RTOL if self.bf16 else REORDER_RTOL

    def computing(self, declared: str | None) -> Precision:
        """This precision with the model's declared compute dtype, unless option ``compute_dtype`` set one."""
        if self.compute or declared in (None, self.dtype):
            return self
        if declared not in DTYPES:
            raise ValueError(
                f"the model declares compute_dtype = torch.{declared}: expected torch.float32 or torch.bfloat16"
            )
        return replace(self, compute=declared)

    def compiled_by(self, backend: str | None) -> Precision:
        """This precision for steps compiled by ``backend`` (None: eager)."""
        return replace(self, compiler=None if backend in (None, *KERNEL_KEEPING_BACKENDS) else backend)

    def describe(self) -> str:
        return self.tolerance() + (f", {GRAPH_SAFE_RNG_OFF}" if self.graph_safe_rng_off else "")

    def tolerance(self) -> str:
        label = self.dtype if self.compute in (None, self.dtype) else f"{self.dtype} params, {self.compute} compute"
        if self.exact:
            return f"{label}, bit for bit"
        if self.bf16:
            return f"{label}, rtol={BF16_RTOL} and atol={BF16_RTOL} x max|expected| per tensor (two bf16 ulps)"
        return (
            f"{label} compiled by {self.compiler}, rtol={REORDER_RTOL} and atol={REORDER_RTOL} x max|expected| "
            f"per tensor (float32 reductions of up to 1024 terms summed in another order)"
        )


EXACT = Precision("float32")


def precision_from(options: GradCkptOptions) -> Precision:
    """float32 is compared bit for bit; bfloat16 within the derived two-ulp tolerance."""
    return Precision(options.dtype, options.compute_dtype)


def compare_values(what: str, actual: dict, expected: dict) -> list[str]:
    """One line per path whose plain values differ or that only one side has (actual first, expected second)."""
    problems = [f"{what} {path}: missing from the second" for path in actual.keys() - expected.keys()]
    problems += [f"{what} {path}: missing from the first" for path in expected.keys() - actual.keys()]
    problems += [
        f"{what} {path}: {actual[path]!r} vs {expected[path]!r}"
        for path in actual.keys() & expected.keys()
        if actual[path] != expected[path]
    ]
    return sorted(problems)


def drift(actual, expected) -> tuple[float, float]:
    """Max absolute and max relative difference (0/0 counts as 0, x/0 as inf), in float64."""
    if actual.numel() == 0:
        return 0.0, 0.0
    actual, expected = actual.double(), expected.double()
    abs_diff = (actual - expected).abs()
    rel_diff = torch.where(abs_diff == 0, torch.zeros_like(abs_diff), abs_diff / expected.abs())
    return abs_diff.max().item(), rel_diff.max().item()


def mismatch(actual, expected, precision: Precision) -> str | None:
    """None when the tensors agree under ``precision`` (bit for bit when exact), else why not."""
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} vs {expected.dtype}"
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)} vs {tuple(expected.shape)}"
    if precision.exact:
        if bits_equal(actual, expected):
            return None
    else:
        try:
            atol = precision.rtol * expected.detach().abs().max().item() if expected.numel() else 0.0
            torch.testing.assert_close(actual, expected, rtol=precision.rtol, atol=atol)
            return None
        except AssertionError:
            pass
    if not actual.is_floating_point() and actual.numel() == 1:
        return f"{actual.item()} vs {expected.item()}"
    described = element_difference(actual, expected)
    return (
        described if not actual.is_floating_point() else f"{described}, max rel diff {drift(actual, expected)[1]:.3e}"
    )


def compare_tensors(what: str, actual: dict, expected: dict, precision: Precision) -> list[str]:
    """One line per name whose tensors differ or that only one side has (actual first, expected second)."""
    problems = [f"{what} {name}: missing from the second" for name in actual.keys() - expected.keys()]
    problems += [f"{what} {name}: missing from the first" for name in expected.keys() - actual.keys()]
    for name in actual.keys() & expected.keys():
        reason = mismatch(actual[name], expected[name], precision)
        if reason:
            problems.append(f"{what} {name}: {reason}")
    return sorted(problems)
