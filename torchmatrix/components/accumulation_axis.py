"""The `accumulation` axis: whether a cell's training step accumulates micro-batches with gradient sync
off before one synced backward, and in which parameter dtype they compute. The reference `parallelize`
reads it for the mixed-precision policy it shards with; parallel_equivalence reads it for the step."""

from __future__ import annotations

from collections.abc import Mapping

ACCUMULATION_AXIS = "accumulation"
NO_ACCUMULATION = "none"
PARAM_DTYPES = {NO_ACCUMULATION: "float32", "fp32": "float32", "bf16": "bfloat16"}
"""Per value, the dtype the forward and backward compute in; gradients are reduced and accumulated in
float32 under each (FSDP2's `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)` for bf16)."""
ACCUMULATION_KINDS = tuple(PARAM_DTYPES)


def accumulation_of(cell: Mapping[str, object]) -> str:
    """The cell's accumulation value (`none` where the cell has no such axis); a value the axis does not
    know is an error naming the ones it does."""
    value = str(cell.get(ACCUMULATION_AXIS, NO_ACCUMULATION))
    if value not in PARAM_DTYPES:
        raise ValueError(f"cell axis accumulation={value!r}: expected one of {', '.join(ACCUMULATION_KINDS)}")
    return value


def accumulates(cell: Mapping[str, object]) -> bool:
    """Whether the cell's step runs several micro-batches before one synced backward."""
    return accumulation_of(cell) != NO_ACCUMULATION


def param_dtype_of(cell: Mapping[str, object]) -> str:
    """The dtype the cell's forward and backward compute in: float32, or bfloat16 under mixed precision."""
    return PARAM_DTYPES[accumulation_of(cell)]
