"""Bit-level comparison for every suite's exact checks: equal bits, and how many ULPs apart (what
differs, in words, is comparison/differences.py's)."""

from __future__ import annotations

import torch

from torchmatrix.testing import same_width_integer


def ulp_distance(actual: torch.Tensor, expected: torch.Tensor) -> int:
    """The largest number of representable floats between two elements at the same index (0 when
    bit-identical); float16/bfloat16/float32 only, elements where either side is NaN ignored."""
    integer = same_width_integer(actual.dtype)
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
