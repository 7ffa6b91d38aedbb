"""parallel_equivalence's cell side: the cell trains in its own world as it would alone, and rank 0
writes what it computed (every step's reduced and clipped gradient and parameters, whole) for the
single-process reference to compare in its own world (suites/references/lockstep.py). The data-parallel step is
here; the pipelined one (axis `pipeline`) is suites/references/pipelining.py's, recorded the same way."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from torchmatrix.components.accumulation_axis import accumulates
from torchmatrix.testing import (
    ParallelEquivalenceOptions,
    build_optimizer,
    call_accepting,
    current_device,
    data_parallel_rank,
    data_parallel_size,
    load,
    user_model,
)

from ..components.parallelize_component import parallelized
from ..components.training_step import build_training_step
from ..state.full_tensors import full_gradients, full_parameters, whole
from .accumulation import accumulated_backward, micro_batch_seeds, sync_switch
from .single_process_reference import DEFAULT_CLIP, batch_seed, optimizer_hyperparameters, seeded_model

CELL_STEPS = "cell-steps.pt"
"""What the cell computed, gathered (rank 0 writes it): the reference reads it in its own world."""


class CellTraining:
    """The cell's parallel training: the model from the suite's seed, wrapped by `parallelize` for the
    cell, trained on shard `data_parallel_rank` of each global batch."""

    def __init__(self, cell: dict, options: ParallelEquivalenceOptions, components: dict):
        self.cell = cell
        self.options = options
        self.device = current_device()
        self.shards = data_parallel_size(cell)
        self.shard = data_parallel_rank(cell)
        self.make_batch = load(components["batch"])
        self.clip = load(components.get("clip_grad_norm", DEFAULT_CLIP))
        self.model = parallelized(components, seeded_model(cell, options, components), cell, device=self.device)
        factory = load(components[f"optimizer_{cell['optimizer']}"])
        self.optimizer = build_optimizer(factory, self.model, **optimizer_hyperparameters(cell, options))
        self.training = build_training_step(components, model=self.model, optimizer=self.optimizer, cell=cell)
        self.no_sync = sync_switch(components, self.model, cell)

    @property
    def tensor_parallel(self) -> bool:
        """Whether ranks share a batch because they hold slices of the same layers."""
        world = dist.get_world_size() if dist.is_initialized() else 1
        return self.shards < world

    def shard_backward(self, step: int) -> torch.Tensor:
        """This rank's shard of the step's global batch, forward and backward: one batch, or where the cell
        accumulates its micro-batches, sync off until the last; returns the step's loss."""
        if accumulates(self.cell):
            seeds = micro_batch_seeds(self.options, self.shards, step, self.shard)
            batches = [self.make_batch(user_model(self.model), seed=seed, device=self.device) for seed in seeds]
            return accumulated_backward(self.training, batches, self.no_sync)
        seed = batch_seed(self.options, self.shards, step, self.shard)
        batch = self.make_batch(user_model(self.model), seed=seed, device=self.device)
        loss = self.training.loss(batch)
        self.training.backward(loss)
        return loss

    def whole_model(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Full tensors of this rank's model on the CPU: every rank holds the whole model here."""
        return on_cpu(tensors)


def train_and_record(training, max_norm: float, path: Path) -> dict:
    """`steps` steps of `training` (CellTraining or PipelinedTraining); every rank returns its losses and
    the norms its clip returned, and rank 0 writes the whole gradients and parameters to `path`."""
    model, cell = training.model, training.cell
    initial = training.whole_model(full_parameters(model))
    losses, norms, steps = [], [], []
    for step in range(training.options.steps):
        model.train()
        loss = training.shard_backward(step)
        reduced = training.whole_model(full_gradients(model))
        norms.append(float(scalar(call_accepting(training.clip, model, max_norm=max_norm, cell=cell))))
        clipped = training.whole_model(full_gradients(model))
        training.training.optimizer_step()
        training.optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach().float().item())
        steps.append(
            {"reduced": reduced, "clipped": clipped, "parameters": training.whole_model(full_parameters(model))}
        )
    if not dist.is_initialized() or dist.get_rank() == 0:
        torch.save({"initial": initial, "steps": steps}, path)
    return {
        "losses": losses,
        "norms": norms,
        "shard": training.shard,
        "shards": training.shards,
        "tensor_parallel": training.tensor_parallel,
    }


def on_cpu(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().cpu() for name, tensor in tensors.items()}


def scalar(norm) -> torch.Tensor:
    """The norm a clip returned as a plain tensor: a DTensor's full value (a collective), else itself."""
    return whole(norm) if isinstance(norm, torch.Tensor) else torch.tensor(norm)
