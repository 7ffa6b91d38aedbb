"""Bit-level float comparison for the suites' exact checks: equal bits, and how many ULPs apart."""

from __future__ import annotations

import torch

SAME_WIDTH_INT = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}


def bits_equal(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Same dtype, shape and bits: stricter than ==, which equates -0.0 with 0.0 and never equates NaNs."""
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return False
    integer = SAME_WIDTH_INT.get(actual.dtype)
    if integer is None:
        return torch.equal(actual, expected)
    return torch.equal(actual.detach().contiguous().view(integer), expected.detach().contiguous().view(integer))


def ulp_distance(actual: torch.Tensor, expected: torch.Tensor) -> int:
    """The largest number of representable floats between two elements at the same index (0 when
    bit-identical); float16/bfloat16/float32 only, elements where either side is NaN ignored."""
    integer = SAME_WIDTH_INT[actual.dtype]
    if integer is torch.int64:
        raise TypeError("ulp_distance covers float32 and narrower; float64 bits overflow the int64 arithmetic")
    if actual.numel() == 0:
        return 0
    lowest = -(2 ** (torch.iinfo(integer).bits - 1))

    def ordered(tensor: torch.Tensor) -> torch.Tensor:
        """Sign-magnitude float bits as integers that increase with the float's value (-0.0 == 0.0)."""
        raw = tensor.detach().contiguous().view(integer).long()
        return torch.where(raw < 0, lowest - raw, raw)

    valid = ~(actual.isnan() | expected.isnan())
    distance = (ordered(actual) - ordered(expected)).abs()[valid]
    return int(distance.max()) if distance.numel() else 0
