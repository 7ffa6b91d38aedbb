"""The components for one run of the resume suite over the reference stack and its mutants side by
side: axis `variant` names, per cell, which components of models/mutants/ (or examples/optimizers'
model) replace the reference ones (`reference`: none), so one rank pool per world size serves them all.

- `build_model` builds the variant's model (one layer a stack but for the reference) and labels it with
  the variant;
- `Checkpointer` is the per-call checkpointer of the variant of the model each call is given (the
  one object both `save` and `load` receive: the cell is not among their arguments), the reference's
  for a model that names none (dtensor_optim's uneven probe);
- `build_training_step` is the variant's training step, the suites' plain one by default.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from torchmatrix.models.transformer import DEPTH_AXIS
from torchmatrix.suites.components.training_step import PlainStep
from torchmatrix.testing import load

REFERENCE = "reference"
REFERENCE_COMPONENTS = {
    "model": "torchmatrix.models.transformer:build_model",
    "checkpointer": "torchmatrix.models.checkpoint:Checkpointer",
    "checkpointer_async": "torchmatrix.models.async_checkpoint:AsyncCheckpointer",
}
ASYNC_MUTANTS = "torchmatrix.models.mutants.async_checkpoint"
THIRD_PARTY_MODEL = "torchmatrix.models.third_party_optim:build_model"
# variant -> the components it replaces, by import path
OVERRIDES = {
    REFERENCE: {},
    "raw_optimizer_state_dict": {"checkpointer": "torchmatrix.models.mutants.resume:RawOptimizerStateCheckpointer"},
    "rng_not_restored": {"checkpointer": "torchmatrix.models.mutants.resume:RngNotRestoredCheckpointer"},
    "scheduler_not_restored": {"checkpointer": "torchmatrix.models.mutants.resume:SchedulerNotRestoredCheckpointer"},
    "scheduler_one_step_late": {"checkpointer": "torchmatrix.models.mutants.resume:SchedulerOneStepLateCheckpointer"},
    "param_groups_not_restored": {
        "checkpointer": "torchmatrix.models.mutants.resume:ParamGroupsNotRestoredCheckpointer"
    },
    "data_position_not_restored": {
        "checkpointer": "torchmatrix.models.mutants.resume:DataPositionNotRestoredCheckpointer"
    },
    "loader_one_batch_late": {"checkpointer": "torchmatrix.models.mutants.resume:LoaderOneBatchLateCheckpointer"},
    "rank_zero_only": {"checkpointer": "torchmatrix.models.mutants.resume:RankZeroOnlyCheckpointer"},
    "loss_scaler_not_saved": {"training_step": "torchmatrix.models.mutants.training_step:UncheckpointedLossScalerStep"},
    "precision_aware_cast_on_load": {},  # the reference components: its optimizer value names the mutant
    "non_persistent_buffer_recomputed_wrongly": {
        "model": "torchmatrix.models.mutants.resume:boost_recomputed_late_model"
    },
    # examples/optimizers' model (wide enough to be quantized), with its checkpointer or a mutant of it
    "third_party": {"model": THIRD_PARTY_MODEL},
    "torchao_scale_dropped": {
        "model": THIRD_PARTY_MODEL,
        "checkpointer": "torchmatrix.models.mutants.quantized_state:TorchaoScaleDroppedCheckpointer",
    },
    "bitsandbytes_absmax_dropped": {
        "model": THIRD_PARTY_MODEL,
        "checkpointer": "torchmatrix.models.mutants.quantized_state:BnbAbsmaxDroppedCheckpointer",
    },
    "optimi_kahan_dropped": {
        "model": THIRD_PARTY_MODEL,
        "checkpointer": "torchmatrix.models.mutants.quantized_state:KahanCompensationDroppedCheckpointer",
    },
    "third_party_rank_zero_only": {
        "model": THIRD_PARTY_MODEL,
        "checkpointer": "torchmatrix.models.mutants.resume:RankZeroOnlyCheckpointer",
    },
    # asynchronous saves (tests/suites/test_async_save_mutants.py): mutants, then valid controls
    "unstaged_cpu_tensors": {"checkpointer_async": f"{ASYNC_MUTANTS}:UnstagedCpuTensorsCheckpointer"},
    "torn_step": {"checkpointer_async": f"{ASYNC_MUTANTS}:TornStepCheckpointer"},
    "stager_not_reusable": {"checkpointer_async": f"{ASYNC_MUTANTS}:StagerNotReusableCheckpointer"},
    "awaited_unstaged": {"checkpointer_async": f"{ASYNC_MUTANTS}:AwaitedUnstagedCheckpointer"},
    "slow_writer": {"checkpointer_async": f"{ASYNC_MUTANTS}:SlowWriterCheckpointer"},
    "staged": {"checkpointer_async": "torchmatrix.models.async_checkpoint:StagedAsyncCheckpointer"},
}


def component_of(variant: str, key: str) -> str | None:
    """The import path of component `key` in `variant`: its override, else the reference's (None: the suites' own)."""
    return OVERRIDES[variant].get(key, REFERENCE_COMPONENTS.get(key))


def build_model(cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32):
    """The cell's variant's model, its `variant` attribute naming the variant for the checkpointer; the
    reference decoder one layer a stack deep for every variant but the reference, whose checkpoint pieces
    a layer more would only repeat (examples/optimizers' model keeps its own depth)."""
    variant = str(cell["variant"])
    if variant != REFERENCE:
        cell = {**cell, DEPTH_AXIS: 1}
    model = load(component_of(variant, "model"))(cell, dropout=dropout, dtype=dtype)
    model.variant = variant
    return model


class Checkpointer:
    """The per-call checkpointer of the variant its model names, built at the first call and kept,
    as the suites keep a per-call checkpointer for one training run."""

    key = "checkpointer"

    def __init__(self):
        self.chosen = None

    def of(self, model):
        if self.chosen is None:
            variant = getattr(model, "variant", REFERENCE)  # dtensor_optim's own probe model names none
            self.chosen = load(component_of(variant, self.key))()
        return self.chosen

    def save(self, directory: str, *, model, optimizer, scheduler, loader, step: int):
        return self.of(model).save(
            directory, model=model, optimizer=optimizer, scheduler=scheduler, loader=loader, step=step
        )

    def load(self, directory: str, *, model, optimizer, scheduler, loader):
        return self.of(model).load(directory, model=model, optimizer=optimizer, scheduler=scheduler, loader=loader)


class AsyncCheckpointer(Checkpointer):
    """The same for `checkpointer_async`: the variant's asynchronous checkpointer, closed with the run."""

    key = "checkpointer_async"

    def close(self) -> None:
        close = getattr(self.chosen, "close", None)
        if callable(close):
            close()


def build_training_step(*, model, optimizer, cell):
    """The cell's variant's training step, the suites' plain one where the variant keeps it."""
    path = component_of(str(cell["variant"]), "training_step")
    factory = load(path) if path else PlainStep
    return factory(model=model, optimizer=optimizer)
