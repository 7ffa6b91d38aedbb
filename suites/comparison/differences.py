"""What differs between two tensors or two trees of training state, worded once for every suite: a
failure then reads alike whichever suite found it, and an exact check means equal bits
(torchmatrix.ranks.bitwise) everywhere, never `torch.equal`'s -0.0 == 0.0."""

from __future__ import annotations

import torch

from torchmatrix.testing import bits_equal, same_width_integer

from .ulp import ulp_distance

ULP_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The dtypes a ULP distance is counted in (float64's bits overflow its int64 arithmetic)."""


def tensor_difference(actual: torch.Tensor, expected: torch.Tensor, reference: str = "expected") -> str | None:
    """None when dtype, shape, device and every bit agree; else what differs in a few words, the side
    compared against called `reference` ("expected", "saved", "single-process")."""
    if actual.dtype != expected.dtype:
        return f"is {actual.dtype}, {reference} {expected.dtype}"
    if actual.shape != expected.shape:
        return f"has shape {tuple(actual.shape)}, {reference} {tuple(expected.shape)}"
    if actual.device != expected.device:
        return f"is on {actual.device}, {reference} on {expected.device}"
    if bits_equal(actual, expected):
        return None
    if actual.numel() == 1:
        return f"is {actual.item()!r}, {reference} {expected.item()!r}"
    return element_difference(actual, expected)


def element_difference(actual: torch.Tensor, expected: torch.Tensor) -> str:
    """Which elements of two same-dtype, same-shape tensors differ in their bits: how many, by how
    many ULPs and how much at most, and the first one's index."""
    differs = differing_elements(actual, expected)
    if not differs.any():  # a tolerance failed on equal bits (a NaN is never close to itself)
        return f"the same bits in all {actual.numel()} elements"
    counted = f"{int(differs.sum())}/{actual.numel()} elements differ"
    first = f", first at {[int(index) for index in differs.nonzero()[0]]}" if actual.dim() else ""
    if equal_as_numbers(actual, expected):
        return f"{counted} in their bits only (-0.0 for 0.0, or another NaN payload){first}"
    ulps = f", max {ulp_distance(actual, expected)} ULP" if actual.dtype in ULP_DTYPES else ""
    return f"{counted}{ulps}, max |Δ| {max_abs_difference(actual, expected):.3e}{first}"


def differing_elements(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Where two same-dtype, same-shape tensors differ in their bits (a -0.0 that was 0.0 does; a NaN
    with the same payload does not), as a bool tensor."""
    integer = same_width_integer(actual.dtype)
    if integer is None:
        return actual != expected
    return actual.detach().contiguous().view(integer) != expected.detach().contiguous().view(integer)


def equal_as_numbers(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Equal by ==, with NaN equal to NaN: what torch.equal sees once NaNs are set aside."""
    if not actual.is_floating_point():
        return torch.equal(actual, expected)
    nan = actual.isnan()
    return torch.equal(nan, expected.isnan()) and torch.equal(actual[~nan], expected[~nan])


def max_abs_difference(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| in float64; NaN where one side holds a NaN the other does not."""
    if actual.numel() == 0:
        return 0.0
    actual, expected = actual.detach().double(), expected.detach().double()
    delta = (actual - expected).abs()
    both_nan = actual.isnan() & expected.isnan()
    return delta.masked_fill(both_nan, 0.0).max().item()


def value_difference(actual, expected, reference: str = "expected") -> str | None:
    """tensor_difference for two tensors; for any other pair of values, None when they are equal and
    of one type, else both in a few words (`brief`)."""
    if isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor):
        return tensor_difference(actual, expected, reference)
    if same_state(actual, expected):
        return None
    return f"is {brief(actual)}, {reference} {brief(expected)}"


def state_differences(actual, expected, path: str = "", reference: str = "expected") -> list[str]:
    """One line per place where two trees of state (dicts, lists, tuples, tensors, plain values)
    differ, each named by its path (`state[3].exp_avg`, `groups[0][<param w>]`): missing, present
    only in `actual`, or what differs there (value_difference)."""
    if isinstance(actual, dict) and isinstance(expected, dict):
        lines = [
            f"{child(path, key)}: missing, {reference} {brief(expected[key])}"
            for key in expected.keys() - actual.keys()
        ]
        lines += [
            f"{child(path, key)}: is {brief(actual[key])}, {reference} nothing"
            for key in actual.keys() - expected.keys()
        ]
        for key in actual.keys() & expected.keys():
            lines += state_differences(actual[key], expected[key], child(path, key), reference)
        return sorted(lines)
    if isinstance(actual, (list, tuple)) and type(actual) is type(expected):
        if len(actual) != len(expected):
            return [f"{path}: has {len(actual)} items, {reference} {len(expected)}"]
        return [
            line
            for index, (item, kept) in enumerate(zip(actual, expected))
            for line in state_differences(item, kept, f"{path}[{index}]", reference)
        ]
    difference = value_difference(actual, expected, reference)
    return [f"{path}: {difference}" if path else difference] if difference else []


def same_state(first, second) -> bool:
    """Whether two trees of state are equal and of one type throughout, tensors bit for bit (dtype and shape included)."""
    if isinstance(first, torch.Tensor) or isinstance(second, torch.Tensor):
        return isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor) and bits_equal(first, second)
    if isinstance(first, (list, tuple)) and type(first) is type(second):
        return len(first) == len(second) and all(same_state(a, b) for a, b in zip(first, second))
    if isinstance(first, dict) and isinstance(second, dict):
        return first.keys() == second.keys() and all(same_state(first[key], second[key]) for key in first)
    return type(first) is type(second) and first == second


def child(path: str, key) -> str:
    """The path of a dict entry: `.key` for a string key, `[key]` for any other."""
    if isinstance(key, str):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def brief(value) -> str:
    """A value in a few words: a one-element tensor by its value, a larger one by shape and dtype, a
    long list or dict by its length."""
    if isinstance(value, torch.Tensor):
        if value.numel() == 1:
            return repr(value.item())
        return f"a {list(value.shape)} {str(value.dtype).removeprefix('torch.')} tensor"
    if isinstance(value, list) and len(value) > 4:
        return f"a list of {len(value)}"
    if isinstance(value, dict) and len(value) > 4:
        return f"a dict of {len(value)}"
    return repr(value)
