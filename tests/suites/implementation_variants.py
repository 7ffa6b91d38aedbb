"""The model component of tests/suites/test_optimizer_impl_mutants.py's run: the reference decoder, as deep
as the product builds the cell for the reference AdamW, one layer a stack for every other optimizer (the
mutants and the controls beside them), whose proofs need no depth: a step and a state dict treat every
layer alike."""

from __future__ import annotations

from torchmatrix.models import transformer

AS_DEEP_AS_THE_CELL = ("adamw",)
"""The optimizers whose cells build the decoder as the product does: the reference's."""


def build_model(cell, **keywords):
    """The reference decoder; one layer a stack unless the cell's optimizer is AS_DEEP_AS_THE_CELL."""
    if cell["optimizer"] not in AS_DEEP_AS_THE_CELL:
        cell = {**cell, transformer.DEPTH_AXIS: 1}
    return transformer.build_model(cell, **keywords)
