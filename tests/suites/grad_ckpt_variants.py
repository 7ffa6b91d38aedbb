"""The model and parallelize components for one run of the grad_ckpt suite over the reference
components and their mutants side by side: axis `variant` names, per cell, a model factory of
models/mutants/grad_ckpt.py or models/mutants/compiled_recompute.py, a parallelize mutant of
PARALLELIZE_MUTANTS (with the reference model), or `reference`, so one rank pool per world size
serves them all."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from torchmatrix.models import parallel, transformer
from torchmatrix.models.mutants import compiled_recompute
from torchmatrix.models.mutants import grad_ckpt as mutants

REFERENCE = "reference"
MODEL_MUTANT_MODULES = (mutants, compiled_recompute)
PARALLELIZE_MUTANTS = {"checkpoint_dropping_parallelize": compiled_recompute.checkpoint_dropping_parallelize}


def build_model(cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32):
    """The model of the cell's variant: the reference decoder, or the mutant factory of that name."""
    variant = str(cell["variant"])
    if variant == REFERENCE or variant in PARALLELIZE_MUTANTS:
        factory = transformer.build_model
    else:
        (factory,) = [getattr(module, variant) for module in MODEL_MUTANT_MODULES if hasattr(module, variant)]
    return factory(cell, dropout=dropout, dtype=dtype)


def parallelize(model, cell: Mapping[str, object], *, device, activation_checkpointing: bool = False, mesh=None):
    """The cell's variant's parallelize: the reference one unless the variant names a mutant of it."""
    chosen = PARALLELIZE_MUTANTS.get(str(cell["variant"]), parallel.parallelize)
    return chosen(model, cell, device=device, activation_checkpointing=activation_checkpointing, mesh=mesh)
