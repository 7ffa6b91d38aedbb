"""The generic mutants as data: one declarative entry per bug class, the component it wraps and the
suite that must catch it.

A mutated matrix names its component `torchmatrix.sensitivity.mutated_components:<mutant>__<key>`,
which resolves (in the rank processes) to the entry's wrapper around the configured component
whose import path INNER_COMPONENTS_VARIABLE carries, so no source is generated."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torchmatrix.components.protocol import DTENSOR_OPTIM, GRAD_CKPT, RESUME
from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.config import Matrix
from torchmatrix.matrix.meshes import TWO_D_MESH_KINDS, mesh_kind
from torchmatrix.matrix.suite_options import ResumeOptions
from torchmatrix.sensitivity.verdicts import CellResult

MUTATED_COMPONENTS = "torchmatrix.sensitivity.mutated_components"
INNER_COMPONENTS_VARIABLE = "TORCHMATRIX_SENSITIVITY_COMPONENTS"
"""The unmutated matrix's `[components]` as JSON, set by the command for the rank processes it starts."""


def component_path(mutant: GenericMutant, key: str) -> str:
    """The import path of `[components]` entry `key` wrapped in `mutant`."""
    return f"{MUTATED_COMPONENTS}:{mutant.name}__{key}"


def applies_everywhere(cell: Cell, matrix: Matrix) -> str | None:
    return None


def single_rank(cell: Cell, matrix: Matrix) -> str | None:
    """Restoring on rank 0 only is restoring on every rank when rank 0 is the only one."""
    return "one rank: rank 0 is every rank" if cell.world_size == 1 else None


def fp32_params_in_resume(cell: Cell, matrix: Matrix) -> str | None:
    """The resume suite builds fp32 params for every optimizer but its bf16 ones, so a cast of
    fp32 state to the param dtype changes nothing there."""
    resume = matrix.suites.get(RESUME)
    options = resume.options if resume is not None and isinstance(resume.options, ResumeOptions) else ResumeOptions()
    optimizer = cell.get("optimizer")
    if optimizer in options.bf16_param_optimizers:
        return None
    return f"resume gives optimizer {optimizer} fp32 params: casting fp32 state to them changes nothing"


def two_d_mesh(cell: Cell, matrix: Matrix) -> str | None:
    """Only params on a 2-D mesh (mesh = hsdp | fsdp_tp) have a second dim to lose."""
    kind = mesh_kind(cell)
    return None if kind in TWO_D_MESH_KINDS else f"mesh={kind}: every param's mesh is 1-D"


@dataclass(frozen=True)
class GenericMutant:
    """One bug class, as a wrapper around one kind of component, and the suite that must catch it."""

    name: str
    bug: str
    suite: str
    component: str
    wrapper: str
    """The function of torchmatrix.sensitivity.mutants that wraps the configured component: it takes the
    component's import path, then `wrapper_args`, and returns the wrapped component."""
    idle: str
    """What did not happen where the mutant marked no act: why a pass there proves nothing (n/a)."""
    wrapper_args: tuple[str, ...] = ()
    not_applicable: Callable[[Cell, Matrix], str | None] = applies_everywhere
    watched_by: str | None = None
    """The one test that can see this mutant, where only one can (its name, with its parameters when
    it has some): n/a in a cell where it skipped on the unmutated components (the stack lacks what
    the mutant would corrupt)."""

    def unseen_in(self, before: CellResult) -> str | None:
        """Why this mutant cannot be seen in a cell the unmutated run gave `before`, or None."""
        if self.watched_by and self.watched_by in before.skipped_tests:
            return f"{self.watched_by} skipped on the unmutated components: {before.skipped_tests[self.watched_by]}"
        return None

    def wraps(self, key: str) -> bool:
        """Whether this mutant replaces the `[components]` entry `key` (`optimizer` stands for every optimizer_<value>)."""
        return key == self.component or (self.component == "optimizer" and key.startswith("optimizer_"))


NO_RECOMPUTE = "the hook never ran inside a checkpointed region (no module of a decoder layer ran during backward)"
RIGHT_AFTER_LOAD = "test_state_restored_right_after_load"


def removed_nothing(piece: str) -> str:
    return f"its load skip removed nothing: the unmutated load left the {piece} as a fresh build has it"


GENERIC_MUTANTS = (
    GenericMutant(
        name="skip_model_on_load",
        bug="checkpointer leaves the model weights unloaded",
        suite=RESUME,
        component="checkpointer",
        wrapper="skips_on_load",
        wrapper_args=("model",),
        idle=removed_nothing("model weights"),
    ),
    GenericMutant(
        name="skip_optimizer_on_load",
        bug="checkpointer drops the optimizer state (the seed's lost moments)",
        suite=RESUME,
        component="checkpointer",
        wrapper="skips_on_load",
        wrapper_args=("optimizer",),
        idle=removed_nothing("optimizer state"),
    ),
    GenericMutant(
        name="skip_scheduler_on_load",
        bug="checkpointer leaves the LR scheduler at its start",
        suite=RESUME,
        component="checkpointer",
        wrapper="skips_on_load",
        wrapper_args=("scheduler",),
        idle=removed_nothing("scheduler"),
    ),
    GenericMutant(
        name="skip_loader_on_load",
        bug="checkpointer leaves the loader at its first batch",
        suite=RESUME,
        component="checkpointer",
        wrapper="skips_on_load",
        wrapper_args=("loader",),
        idle=removed_nothing("loader position"),
    ),
    GenericMutant(
        name="skip_rng_on_load",
        bug="checkpointer leaves the RNG streams unrestored",
        suite=RESUME,
        component="checkpointer",
        wrapper="skips_on_load",
        wrapper_args=("rng",),
        idle=removed_nothing("RNG streams"),
        watched_by=f"{RIGHT_AFTER_LOAD}[piece=rng]",
    ),
    GenericMutant(
        name="restore_on_rank_zero_only",
        bug="checkpointer restores every piece on rank 0 only",
        suite=RESUME,
        component="checkpointer",
        wrapper="restores_on_rank_zero_only",
        idle="its load skip removed nothing: the unmutated load changed nothing on ranks 1.. that a fresh build did not hold",
        not_applicable=single_rank,
    ),
    GenericMutant(
        name="moments_cast_to_param_dtype",
        bug="optimizer load casts its state (moments, master) to the param dtype",
        suite=RESUME,
        component="optimizer",
        wrapper="moments_cast_on_load",
        idle="the cast changed nothing: every loaded floating state already had its param's dtype",
        not_applicable=fp32_params_in_resume,
    ),
    GenericMutant(
        name="recompute_bumps_buffer",
        bug="a layer bumps a buffer on every run of its modules, recompute included",
        suite=GRAD_CKPT,
        component="model",
        wrapper="counts_body_runs_in_buffer",
        idle=NO_RECOMPUTE,
    ),
    GenericMutant(
        name="recompute_bumps_cache_counter",
        bug="an int counter on the cache is bumped on every run of a layer's modules, recompute included",
        suite=GRAD_CKPT,
        component="model",
        wrapper="counts_body_runs_on_cache",
        idle=NO_RECOMPUTE,
        watched_by="test_recompute_reruns_layers_and_rewrites_cache_identically",
    ),
    GenericMutant(
        name="recompute_appends_to_attribute",
        bug="a layer appends to a plain list attribute on every run of its modules, recompute included",
        suite=GRAD_CKPT,
        component="model",
        wrapper="appends_to_list_attribute",
        idle=NO_RECOMPUTE,
    ),
    GenericMutant(
        name="recompute_reads_a_later_micro_batch",
        bug="a layer's modules hold their last input across calls and recompute reads it (a cache held on the module)",
        suite=GRAD_CKPT,
        component="model",
        wrapper="holds_inputs_across_calls",
        idle="no module of a decoder layer was recomputed on another input than its own (no micro-batch forward ran between its forward and its recompute)",
    ),
    GenericMutant(
        name="generator_not_saved",
        bug="the model draws noise from a torch.Generator it owns, which no checkpointer saves",
        suite=RESUME,
        component="model",
        wrapper="draws_from_own_generator",
        idle="the model drew no noise: no decoder layer returned a floating tensor in training",
    ),
    GenericMutant(
        name="optimizer_counter_not_saved",
        bug="the optimizer counts steps on itself, outside its state dict, and warms up by that count",
        suite=RESUME,
        component="optimizer",
        wrapper="counts_steps_on_optimizer",
        idle="the optimizer never stepped",
    ),
    GenericMutant(
        name="loader_shuffle_seed_not_saved",
        bug="the loader reorders every epoch after the first from a seed its state dict lacks",
        suite=RESUME,
        component="dataset",
        wrapper="reshuffles_from_unsaved_seed",
        idle="no batch past the first epoch was read (not even by the loader check after the load)",
    ),
    GenericMutant(
        name="state_replicated_on_2d_mesh",
        bug="optimizer state of a param on a 2-D mesh kept Replicate on every dim (HSDP state flattened to one copy)",
        suite=DTENSOR_OPTIM,
        component="optimizer",
        wrapper="replicates_state_on_2d_meshes",
        idle="no param on a 2-D mesh had DTensor state after a step",
        not_applicable=two_d_mesh,
    ),
    GenericMutant(
        name="step_dtype_changed_on_load",
        bug="optimizer load puts `step` in another dtype than the one saved (pytorch#173901)",
        suite=RESUME,
        component="optimizer",
        wrapper="recasts_step_on_load",
        idle="no optimizer state held a floating tensor `step` after the load",
    ),
)


def mutant_named(name: str) -> GenericMutant | None:
    return next((mutant for mutant in GENERIC_MUTANTS if mutant.name == name), None)
