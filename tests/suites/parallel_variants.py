"""Components for one run of the parallel_equivalence suite over the reference stack and its
mutants side by side: axis `variant` picks, per cell, the reference or the mutant of
models/mutants/parallel_equivalence.py, so one rank pool per world size serves them all."""

from __future__ import annotations

from torchmatrix.models import parallel
from torchmatrix.models.mutants.parallel_equivalence import (
    clip_grad_norm_of_local_shards,
    parallelize_reducing_in_bf16,
)
from torchmatrix.suites import gradient_clipping

REFERENCE, LOCAL_NORM, BF16_REDUCTIONS = "reference", "local_norm", "bf16_reductions"
VARIANTS = (REFERENCE, LOCAL_NORM, BF16_REDUCTIONS)


def parallelize(model, cell, *, device, activation_checkpointing=False, mesh=None):
    """The reference parallelize, or under variant bf16_reductions the one that reduces in bf16."""
    chosen = parallelize_reducing_in_bf16 if cell["variant"] == BF16_REDUCTIONS else parallel.parallelize
    return chosen(model, cell, device=device, activation_checkpointing=activation_checkpointing, mesh=mesh)


def clip_grad_norm(model, *, max_norm, cell):
    """The reference clip, or under variant local_norm the one that clips by this rank's shards."""
    chosen = clip_grad_norm_of_local_shards if cell["variant"] == LOCAL_NORM else gradient_clipping.clip_grad_norm
    return chosen(model, max_norm=max_norm)
