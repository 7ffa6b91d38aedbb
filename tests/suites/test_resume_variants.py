"""tests/suites/resume_variants.py, the components the resume mutants' shared run picks per cell by
axis `variant`: each variant gets its own model, checkpointer and training step, never the
reference's in their place (which would make a mutant's cell prove nothing)."""

from __future__ import annotations

import pytest
import resume_variants  # tests/suites/, beside this file

from torchmatrix.models.checkpoint import Checkpointer
from torchmatrix.models.mutants import resume as mutants
from torchmatrix.models.mutants.training_step import UncheckpointedLossScalerStep
from torchmatrix.suites.components.training_step import PlainStep

CELL = {"world_size": 1, "fsdp": "none", "attn": "sdpa", "optimizer": "adamw"}


def built(variant: str):
    """The variant's model, its checkpointer as the suites build it (per call, no arguments) after
    one call, and its training step."""
    cell = {**CELL, "variant": variant}
    model = resume_variants.build_model(cell)
    checkpointer = resume_variants.Checkpointer()
    step = resume_variants.build_training_step(model=model, optimizer=None, cell=cell)
    return model, checkpointer.of(model), step


def test_each_variant_gets_its_own_checkpointer_model_and_training_step():
    model, checkpointer, step = built("reference")
    assert type(checkpointer) is Checkpointer and type(step) is PlainStep
    assert not hasattr(model.embed, "boost")
    _, checkpointer, _ = built("raw_optimizer_state_dict")
    assert type(checkpointer) is mutants.RawOptimizerStateCheckpointer
    _, _, step = built("loss_scaler_not_saved")
    assert type(step) is UncheckpointedLossScalerStep
    model, checkpointer, _ = built("non_persistent_buffer_recomputed_wrongly")
    assert hasattr(model.embed, "boost") and type(checkpointer) is Checkpointer


def test_the_checkpointer_keeps_the_one_it_chose_for_its_run():
    reference, _, _ = built("reference")
    mutant, _, _ = built("rng_not_restored")
    checkpointer = resume_variants.Checkpointer()
    assert type(checkpointer.of(mutant)) is mutants.RngNotRestoredCheckpointer
    assert checkpointer.of(reference) is checkpointer.of(mutant)


def test_a_variant_it_does_not_know_is_an_error_not_the_reference():
    with pytest.raises(KeyError, match="no_such_variant"):
        built("no_such_variant")
