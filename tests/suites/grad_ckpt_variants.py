"""The model and parallelize components for one run of the grad_ckpt suite over the reference
components and their mutants side by side: axis `variant` names, per cell, a model factory of
models/mutants/grad_ckpt.py, compiled_recompute.py or eager_twin.py, a variant of PARALLELIZE_MUTANTS
(its parallelize, with that module's model of the same name or the reference one), or `reference`, so
one rank pool per world size serves them all."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from torchmatrix.models import parallel, transformer
from torchmatrix.models.mutants import compiled_recompute, eager_twin
from torchmatrix.models.mutants import grad_ckpt as mutants

REFERENCE = "reference"
ONE_LAYER = ("rng_forgetting_model", "buffer_counting_model", "last_bit_gradient_model", "never_checkpointing_model")
"""Eager mutants built one layer a stack deep: what each breaks it breaks in every layer, and its failure
names layer 0; the others name a deeper layer, count across the stack or build their own decoder. A
compiled cell names its depth itself (axis layers_per_stack)."""
MODEL_MUTANT_MODULES = (mutants, compiled_recompute, eager_twin)
PARALLELIZE_MUTANTS = {
    "checkpoint_dropping_parallelize": compiled_recompute.checkpoint_dropping_parallelize,
    "graph_breaking_model": eager_twin.fullgraph_false_parallelize,
}


def build_model(cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32):
    """The model of the cell's variant: the mutant factory of that name, else the reference decoder; one
    layer a stack for the variants of ONE_LAYER."""
    variant = str(cell["variant"])
    if variant in ONE_LAYER:
        cell = {**cell, transformer.DEPTH_AXIS: 1}
    named = [getattr(module, variant) for module in MODEL_MUTANT_MODULES if hasattr(module, variant)]
    (factory,) = [found for found in named if found is not PARALLELIZE_MUTANTS.get(variant)] or [
        transformer.build_model
    ]
    return factory(cell, dropout=dropout, dtype=dtype)


def parallelize(model, cell: Mapping[str, object], *, device, activation_checkpointing: bool = False, mesh=None):
    """The cell's variant's parallelize: the reference one unless the variant names a mutant of it."""
    chosen = PARALLELIZE_MUTANTS.get(str(cell["variant"]), parallel.parallelize)
    return chosen(model, cell, device=device, activation_checkpointing=activation_checkpointing, mesh=mesh)
