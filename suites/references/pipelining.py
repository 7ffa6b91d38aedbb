"""parallel_equivalence under pipeline parallelism (axis `pipeline`): the cell's model split into stages
(`pipeline_split`) over the "pp" ranks, FSDP2 over the "dp_shard" ranks of each stage, one
`torch.distributed.pipelining` schedule step (`pipeline_schedule`) per training step over
`micro_batches` micro-batches of each data-parallel shard. The single-process reference runs the same
micro-batches through the whole model in its own world, and names what a gradient that went wrong holds
instead (docs/explanation/parallel-equivalence.md)."""

from __future__ import annotations

import inspect
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from torchmatrix.components.pipeline_axis import (
    PIPELINE_RANKS,
    STAGES_PER_RANK,
    pipeline_of,
    stage_count,
)
from torchmatrix.matrix.meshes import PP_DIM, SHARD_DIM
from torchmatrix.testing import (
    ParallelEquivalenceOptions,
    UnavailableImplementation,
    build_optimizer,
    call_accepting,
    cell_mesh,
    current_device,
    data_parallel_rank,
    data_parallel_size,
    load,
)

from ..comparison.differences import tensor_difference
from ..comparison.summation_bounds import MeanReduction
from ..components.parallelize_component import parallelized
from ..components.training_step import build_training_step
from ..state.built_names import module_names, named_parameters_as_built, remember_built
from .accumulation import accumulate, mean_over_shards, within
from .cell_training import on_cpu
from .single_process_reference import (
    DEFAULT_CLIP,
    SingleProcessReference,
    batch_seed,
    optimizer_hyperparameters,
    seeded_model,
)

DEFAULT_SPLIT = "torchmatrix.models.pipeline_stages:split_decoder"
DEFAULT_SCHEDULE = "torchmatrix.suites.references.pipelining:build_schedule"
SCHEDULE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved_1f1b": "ScheduleInterleaved1F1B"}
STAGE_ARGUMENTS = ("submodule", "stage_index", "num_stages", "device", "group")
"""What the suite builds a `PipelineStage` with; a release whose constructor takes other arguments skips."""


def pipelining_api(name: str):
    """`torch.distributed.pipelining.<name>`; UnavailableImplementation naming it where this release lacks it."""
    try:
        import torch.distributed.pipelining as pipelining
    except ImportError as error:
        raise UnavailableImplementation(
            f"torch {torch.__version__} has no torch.distributed.pipelining ({error}): pipelined cells need it"
        ) from error
    found = getattr(pipelining, name, None)
    if found is None:
        raise UnavailableImplementation(
            f"torch {torch.__version__}'s torch.distributed.pipelining has no {name}: its pipelining API moved"
        )
    return found


class PipeliningApiMoved(RuntimeError):
    """The stack's pipeline components call a `torch.distributed.pipelining` API this release does not have."""


@contextmanager
def naming_moved_api():
    """An AttributeError on a `torch.distributed.pipelining` object, re-raised as PipeliningApiMoved naming the
    attribute and the release: the cell's tests fail with that line, not with a traceback through the stack."""
    try:
        yield
    except AttributeError as error:
        owner = getattr(error, "obj", None)
        if owner is None or not type(owner).__module__.startswith("torch.distributed.pipelining"):
            raise
        raise PipeliningApiMoved(
            f"torch {torch.__version__}'s {type(owner).__name__} has no {error.name}: the pipeline_split or "
            "pipeline_schedule component calls a pipelining API this release moved or removed (as 2.13 removed "
            "PipelineStage._configure_outputs_meta)"
        ) from None  # the reports lead with the innermost exception: this line, not the bare AttributeError


def pipeline_stage(module: nn.Module, index: int, count: int, device: torch.device, group):
    """`PipelineStage(submodule, stage_index, num_stages, device, group=...)`, its inputs and outputs inferred
    from the first micro-batch; UnavailableImplementation naming the constructor where it takes other arguments."""
    stage_class = pipelining_api("PipelineStage")
    parameters = inspect.signature(stage_class).parameters
    missing = [name for name in STAGE_ARGUMENTS if name not in parameters]
    if missing:
        raise UnavailableImplementation(
            f"torch {torch.__version__}'s PipelineStage({', '.join(parameters)}) lacks {', '.join(missing)}: stage "
            "construction moved in this release"
        )
    return stage_class(module, index, count, device, group=group)


def build_schedule(stages: list, *, n_microbatches: int, loss_fn, cell: dict, scale_grads: bool = True):
    """Component `pipeline_schedule`'s default: the cell's schedule over this rank's stages, `scale_grads` at
    its default (True: the accumulated gradient divided by `n_microbatches`), which matches `loss_fn`, each
    micro-batch's mean; False matches a loss already divided by `n_microbatches`."""
    schedule = pipelining_api(SCHEDULE_CLASSES[pipeline_of(cell)])
    over = stages if STAGES_PER_RANK[pipeline_of(cell)] > 1 else stages[0]
    return schedule(over, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=scale_grads)


def micro_batches_of(batch: dict, count: int) -> list[dict]:
    """`batch` cut into `count` micro-batches along dim 0, as a schedule's step cuts its inputs (tensor_split)."""
    rows = {int(value.shape[0]) for value in batch.values()}
    if min(rows) < count:
        raise ValueError(
            f"micro_batches = {count} cannot cut a batch of {min(rows)} rows: lower [suites.parallel_equivalence."
            "options] micro_batches or make the batch component's batches larger"
        )
    chunks = {name: torch.tensor_split(value, count, dim=0) for name, value in batch.items()}
    return [{name: parts[index] for name, parts in chunks.items()} for index in range(count)]


def step_loss(losses: list[torch.Tensor], divisor: int) -> torch.Tensor:
    """The step's loss from its micro-batches' losses: summed in micro-batch order in float32, divided once."""
    total = torch.zeros((), dtype=torch.float32)
    for loss in losses:
        total = total + loss.detach().float().cpu()
    return total / divisor


class PipelinedTraining:
    """The cell's pipelined training: every rank builds the whole model from the suite's seed and keeps
    its stages (looped: stage r, r + PIPELINE_RANKS, ... on pipeline rank r), each wrapped by `parallelize`
    over the "dp_shard" mesh, one optimizer over their parameters."""

    tensor_parallel = False

    def __init__(self, cell: dict, options: ParallelEquivalenceOptions, components: dict):
        self.cell, self.options = cell, options
        self.device = current_device()
        mesh = cell_mesh(cell, self.device.type)
        self.pipeline_group = mesh[PP_DIM].get_group()
        self.shards, self.shard = data_parallel_size(cell), data_parallel_rank(cell)
        self.make_batch = load(components["batch"])
        self.clip = load(components.get("clip_grad_norm", DEFAULT_CLIP))
        self.whole = seeded_model(cell, options, components)
        names = module_names(self.whole)
        self.split = call_accepting(
            load(components.get("pipeline_split", DEFAULT_SPLIT)), self.whole, stages=stage_count(cell), cell=cell
        )
        count = len(self.split.stages)
        self.indices = list(range(mesh[PP_DIM].get_local_rank(), count, PIPELINE_RANKS))
        parts = [
            parallelized(components, self.split.stages[index], cell, device=self.device, mesh=mesh[SHARD_DIM])
            for index in self.indices
        ]
        self.model = remember_built(nn.ModuleList(parts), names)
        factory = load(components[f"optimizer_{cell['optimizer']}"])
        self.optimizer = build_optimizer(factory, self.model, **optimizer_hyperparameters(cell, options))
        self.training = build_training_step(components, model=self.model, optimizer=self.optimizer, cell=cell)
        stages = [
            pipeline_stage(part, index, count, self.device, self.pipeline_group)
            for part, index in zip(parts, self.indices)
        ]
        self.first, self.last = 0 in self.indices, count - 1 in self.indices
        with naming_moved_api():
            self.schedule = call_accepting(
                load(components.get("pipeline_schedule", DEFAULT_SCHEDULE)),
                stages,
                n_microbatches=options.micro_batches,
                loss_fn=self.split.loss,
                cell=cell,
            )

    def shard_backward(self, step: int) -> torch.Tensor:
        """One schedule step on this data-parallel shard's batch; returns the step's loss on every rank of the
        pipeline: the last stage's micro-batch losses summed in order, divided by their count where the
        schedule scales the gradients so (a loss already divided by it is summed)."""
        seed = batch_seed(self.options, self.shards, step, self.shard)
        batch = self.make_batch(self.whole, seed=seed, device=self.device)
        losses: list[torch.Tensor] = []
        with naming_moved_api():
            self.schedule.step(
                *(self.split.inputs(batch) if self.first else ()),
                target=self.split.target(batch) if self.last else None,
                losses=losses if self.last else None,
            )
        scaled = getattr(self.schedule, "scale_grads", True)
        loss = step_loss(losses, self.options.micro_batches if scaled else 1)
        dist.all_reduce(loss, group=self.pipeline_group)  # the other stages add 0: the last stage's loss, exactly
        return loss

    def whole_model(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Full tensors of every stage, gathered from the pipeline ranks that hold them."""
        gathered: list[dict] = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(gathered, on_cpu(tensors))
        return {name: tensor for part in reversed(gathered) for name, tensor in part.items()}


class PipelinedReference(SingleProcessReference):
    """The single-process reference of a pipelined cell: per shard, the batch cut into the same micro-batches,
    each one's mean loss through the whole model and back, their gradients summed in float32 in micro-batch
    order and divided by their count once; then the shards' mean as before."""

    def __init__(self, cell: dict, options: ParallelEquivalenceOptions, components: dict, shards: int):
        super().__init__(cell, options, components, shards)
        self.count = options.micro_batches
        split = call_accepting(
            load(components.get("pipeline_split", DEFAULT_SPLIT)), self.model, stages=stage_count(cell), cell=cell
        )
        holder = {id(param): index for index, stage in enumerate(split.stages) for param in stage.parameters()}
        self.stage_of = {name: holder[id(param)] for name, param in named_parameters_as_built(self.model)}
        self.micro: list[list[dict[str, torch.Tensor]]] = []

    def gradient(self, step: int) -> tuple[dict, dict, list]:
        """The global batch's mean gradient (each shard's micro-batches summed in float32, divided by their
        count, the shards summed in order and divided once), sum_d |g_d| in float64, each shard's loss."""
        self.micro, losses = [], []
        for shard in range(self.shards):
            gradients, micro_losses = [], []
            for batch in micro_batches_of(self.batch(step, shard), self.count):
                self.model.zero_grad(set_to_none=True)
                loss = self.training.loss(batch)
                self.training.backward(loss)
                micro_losses.append(loss)
                gradients.append(
                    {
                        name: param.grad.detach().cpu().clone()
                        for name, param in named_parameters_as_built(self.model)
                        if param.grad is not None
                    }
                )
            self.micro.append(gradients)
            losses.append(step_loss(micro_losses, self.count))
        self.model.zero_grad(set_to_none=True)
        mean, magnitude = self.expected()
        return mean, magnitude, losses

    def expected(self) -> tuple[dict, dict]:
        """From the last `gradient`'s micro-batches: the mean over shards of each shard's micro-batch gradients
        summed in float32 and divided by their count, and sum_d |g_d| in float64 (the reduction bound's)."""
        per_shard = [divided(accumulate(gradients, torch.float32), self.count) for gradients in self.micro]
        magnitude = {name: sum(shard[name].double().abs() for shard in per_shard) for name in per_shard[0]}
        return mean_over_shards(per_shard), magnitude

    def micro_batch_lines(self, reduced: dict, reduction: MeanReduction) -> list[str]:
        """One line per gradient of the cell that is not the global batch's mean within the reduction bound,
        naming its stage and what it holds instead where one of the known pipeline faults explains it."""
        expected, magnitude = self.expected()
        faults = schedule_faults(self.micro)
        lines = []
        for name in sorted(reduced.keys() & expected.keys()):
            if within(reduced[name], expected[name], magnitude[name], reduction):
                continue
            causes = [
                cause for cause, held in faults.items() if within(reduced[name], held[name], magnitude[name], reduction)
            ]
            held = causes[0] if causes else unexplained(reduced[name], expected[name], self.count)
            lines.append(f"{name} (stage {self.stage_of[name]}): {held}")
        return lines


def divided(gradients: dict[str, torch.Tensor], divisor: int) -> dict[str, torch.Tensor]:
    return {name: value / divisor for name, value in gradients.items()}


def schedule_faults(micro: list[list[dict]]) -> dict[str, dict[str, torch.Tensor]]:
    """What the reduced gradient would hold under each known pipeline fault, by its description."""
    count = len(micro[0])
    earlier = "micro-batch 0" if count == 2 else f"micro-batches 0..{count - 2}"

    def mean(pick, divisor: int) -> dict[str, torch.Tensor]:
        return mean_over_shards([divided(accumulate(pick(gradients), torch.float32), divisor) for gradients in micro])

    return {
        f"gradient is 1/{count} of the global batch's mean: divided by the micro-batch count twice (the schedule's "
        f"scale_grads=True on a loss already divided by {count}: torchtitan#1733)": mean(list, count * count),
        f"gradient is the sum of the {count} micro-batches' gradients, {count}x their mean: nothing divided by the "
        "micro-batch count before or in the schedule's backward (scale_grads=False, the loss normalised only after "
        "the schedule's internal backward: torchtitan#2972)": mean(list, 1),
        f"gradient holds only micro-batch {count - 1}'s contribution (of 0..{count - 1}), divided by {count}: what "
        f"{earlier} accumulated was wiped (the stage re-initialised or its gradients zeroed between "
        "micro-batches: NeMo Automodel PR #3530)": mean(lambda gradients: gradients[-1:], count),
    }


def unexplained(actual: torch.Tensor, expected: torch.Tensor, count: int) -> str:
    """The line for a gradient no known fault explains: by how much it differs."""
    difference = tensor_difference(actual, expected, "the mean")
    return f"not the mean of the {count} micro-batches' gradients ({difference}); no known pipeline fault explains it"
