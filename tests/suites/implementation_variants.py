"""The model component of tests/suites/test_optimizer_impl_mutants.py's run: the reference decoder, as deep
as the product builds the cell for the reference AdamW stepped eagerly, one layer a stack for its compiled
step and for every other optimizer (the mutants and the controls beside them), whose proofs need no depth:
a step and a state dict treat every layer alike."""

from __future__ import annotations

from torchmatrix.models import transformer
from torchmatrix.testing import IMPLEMENTATION_AXIS

AS_DEEP_AS_THE_CELL = ("adamw",)
"""The optimizers whose eager cells build the decoder as the product does: the reference's."""
SHALLOW_IMPLEMENTATIONS = ("compiled",)
"""Implementations built one layer a stack whatever the optimizer: the compiled step's Dynamo trace and
Inductor build grow with every parameter, and the reference's eager cells already prove the product's depth."""


def build_model(cell, **keywords):
    """The reference decoder; one layer a stack unless the cell's optimizer is AS_DEEP_AS_THE_CELL and its
    implementation is not in SHALLOW_IMPLEMENTATIONS."""
    if cell["optimizer"] not in AS_DEEP_AS_THE_CELL or cell[IMPLEMENTATION_AXIS] in SHALLOW_IMPLEMENTATIONS:
        cell = {**cell, transformer.DEPTH_AXIS: 1}
    return transformer.build_model(cell, **keywords)
