"""Components for one run of the parallel_equivalence suite over the reference stack and its
mutants side by side: axis `variant` picks, per cell, the reference or the mutant of
models/mutants/parallel_equivalence.py, so one rank pool per world size serves them all."""

from __future__ import annotations

from torchmatrix.models import parallel, transformer
from torchmatrix.models.mutants import parallel_equivalence as mutants
from torchmatrix.models.mutants import tensor_parallel_plans as plans
from torchmatrix.suites.components import gradient_clipping

REFERENCE, LOCAL_NORM, BF16_REDUCTIONS = "reference", "local_norm", "bf16_reductions"
LOSS_OVER_WORLD, BACKWARD_OVER_WORLD, MESH_OVER_WORLD, MODEL_OVER_WORLD = (
    "loss_over_world",
    "backward_over_world",
    "mesh_over_world",
    "model_over_world",
)
PLANS = {
    "tp_grad_twice": plans.parallelize_reducing_input_gradients_twice,
    "tp_grad_over_world": plans.parallelize_reducing_input_gradients_over_world,
    "tp_grad_never": plans.parallelize_never_reducing_input_gradients,
    "tp_grad_twice_deeper": plans.parallelize_reducing_deeper_input_gradients_twice,
    "mlp_only_plan": plans.parallelize_splitting_the_mlp_only,
}
"""Tensor-parallel plans: ones that sum a column-wise projection's input gradient twice, over the
world, never, or twice past each stack's first layer, and a valid one of another shape (the control)."""
TRAINING_STEPS = {
    LOSS_OVER_WORLD: mutants.LossAveragedOverWorldStep,
    BACKWARD_OVER_WORLD: mutants.BackwardScaledByWorldStep,
    MESH_OVER_WORLD: mutants.LossOverOwnMeshStep,
}


AS_DEEP_AS_THE_CELL = (REFERENCE, "tp_grad_twice_deeper")
"""Variants built as deep as the product builds their eager cells: the reference, and the plan that needs a
second layer (its control the reference beside it). Every other variant is caught, or stays green, at one
layer a stack, which a cell of four ranks pays for layer by layer; so is the compiled cell, whose proof (the
reference named as built) needs no depth either."""


def build_model(cell, **keywords):
    """The reference decoder, or under variant model_over_world the one whose loss divides by the world's
    size; one layer a stack unless the variant is AS_DEEP_AS_THE_CELL and the cell eager."""
    if cell["variant"] not in AS_DEEP_AS_THE_CELL or cell["compile"] != "none":
        cell = {**cell, transformer.DEPTH_AXIS: 1}
    if cell["variant"] == MODEL_OVER_WORLD:
        return mutants.build_model_averaging_over_world(cell, **keywords)
    return transformer.build_model(cell, **keywords)


def parallelize(model, cell, *, device, activation_checkpointing=False, mesh=None):
    """The reference parallelize, under variant bf16_reductions the one that reduces in bf16, under a
    variant of PLANS the one applying that tensor-parallel plan."""
    chosen = mutants.parallelize_reducing_in_bf16 if cell["variant"] == BF16_REDUCTIONS else parallel.parallelize
    chosen = PLANS.get(cell["variant"], chosen)
    return chosen(model, cell, device=device, activation_checkpointing=activation_checkpointing, mesh=mesh)


def clip_grad_norm(model, *, max_norm, cell):
    """The reference clip, or under variant local_norm the one that clips by this rank's shards."""
    chosen = (
        mutants.clip_grad_norm_of_local_shards if cell["variant"] == LOCAL_NORM else gradient_clipping.clip_grad_norm
    )
    return chosen(model, max_norm=max_norm)


def training_step(model, optimizer, cell):
    """The plain step (None), or under a variant that reads the world the step that does."""
    step = TRAINING_STEPS.get(cell["variant"])
    return step(model, optimizer) if step else None
