"""The model component for one run of the grad_ckpt suite over the reference model and its mutants
side by side: axis `variant` names, per cell, a factory of models/mutants/grad_ckpt.py (or
`reference`), so one rank pool per world size serves them all."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from torchmatrix.models import transformer
from torchmatrix.models.mutants import grad_ckpt as mutants

REFERENCE = "reference"


def build_model(cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32):
    """The model of the cell's variant: the reference decoder, or the mutant factory of that name."""
    variant = str(cell["variant"])
    factory = transformer.build_model if variant == REFERENCE else getattr(mutants, variant)
    return factory(cell, dropout=dropout, dtype=dtype)
