"""Components for one run of the parallel_equivalence suite over accumulating cells of the reference stack
and its accumulation mutants side by side: axis `variant` picks, per cell, the reference or the mutant of
models/mutants/accumulation.py, so one rank pool serves them all."""

from __future__ import annotations

from torchmatrix.models import parallel
from torchmatrix.models.mutants import accumulation as mutants
from torchmatrix.suites.references import accumulation

REFERENCE, PARAM_DTYPE_ACCUMULATION, LAST_MICRO_BATCH, NO_SYNC_NO_OP = (
    "reference",
    "param_dtype_accumulation",
    "last_micro_batch",
    "no_sync_no_op",
)
PARALLELIZE = {
    PARAM_DTYPE_ACCUMULATION: mutants.parallelize_accumulating_in_param_dtype,
    LAST_MICRO_BATCH: mutants.parallelize_keeping_the_last_micro_batch,
}


def parallelize(model, cell, *, device, activation_checkpointing=False, mesh=None):
    """The reference parallelize, or under a variant that breaks FSDP2's accumulation the one that does."""
    chosen = PARALLELIZE.get(cell["variant"], parallel.parallelize)
    return chosen(model, cell, device=device, activation_checkpointing=activation_checkpointing, mesh=mesh)


def no_sync(model, cell):
    """The suite's own sync switch, or under variant no_sync_no_op the one that is a no-op under FSDP2."""
    if cell["variant"] == NO_SYNC_NO_OP:
        return mutants.no_sync_where_the_model_has_one(model)
    return accumulation.gradient_sync_off(model)
