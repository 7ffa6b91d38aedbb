"""Bit-level comparison for every suite's exact checks: equal bits, what differs, and how many ULPs apart."""

from __future__ import annotations

import torch

from torchmatrix.testing import bits_equal, same_width_integer


def differing_bits(actual: torch.Tensor, expected: torch.Tensor) -> int:
    """How many elements of two same-dtype, same-shape tensors differ in their bits (a -0.0 that
    was 0.0 counts; a NaN with the same payload does not)."""
    integer = same_width_integer(actual.dtype)
    if integer is None:
        return int((actual != expected).sum())
    return int((actual.detach().contiguous().view(integer) != expected.detach().contiguous().view(integer)).sum())


def bits_difference(actual: torch.Tensor, expected: torch.Tensor, reference: str = "expected") -> str | None:
    """None when dtype, shape and every bit agree (bits_equal), else what differs; `reference` is the
    word for the side compared against ("expected", "saved")."""
    if actual.dtype != expected.dtype:
        return f"is {actual.dtype}, {reference} {expected.dtype}"
    if actual.shape != expected.shape:
        return f"has shape {tuple(actual.shape)}, {reference} {tuple(expected.shape)}"
    if bits_equal(actual, expected):
        return None
    if actual.numel() == 1:
        return f"is {actual.item()!r}, {reference} {expected.item()!r}"
    differing = f"{differing_bits(actual, expected)}/{actual.numel()} elements differ"
    if _equal_as_numbers(actual, expected):
        return f"{differing} in their bits only (-0.0 for 0.0, or another NaN payload)"
    delta = (actual.double() - expected.double()).abs()
    return f"{differing}, max |Δ| {delta.nan_to_num(0.0).max().item():.1e}"


def _equal_as_numbers(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Equal by ==, with NaN equal to NaN: what torch.equal sees once NaNs are set aside."""
    if not actual.is_floating_point():
        return torch.equal(actual, expected)
    nan = actual.isnan()
    return torch.equal(nan, expected.isnan()) and torch.equal(actual[~nan], expected[~nan])


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
