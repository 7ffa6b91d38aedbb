"""Equal bits: the one exact check, shared by the suites' comparisons and the mutants that must
know whether they changed anything; stricter than `torch.equal`, which equates -0.0 with 0.0 and
never equates a NaN with itself."""

from __future__ import annotations


def same_width_integer(dtype):
    """The integer dtype a float's bits are viewed as, or None where `dtype` is not a float torch views so."""
    import torch

    widths = {
        torch.float64: torch.int64,
        torch.float32: torch.int32,
        torch.bfloat16: torch.int16,
        torch.float16: torch.int16,
    }
    return widths.get(dtype)


def bits_equal(actual, expected) -> bool:
    """Same dtype, shape and bits."""
    import torch

    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return False
    integer = same_width_integer(actual.dtype)
    if integer is None:
        return torch.equal(actual, expected)
    return torch.equal(actual.detach().contiguous().view(integer), expected.detach().contiguous().view(integer))
