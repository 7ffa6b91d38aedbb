"""A training run built from the cell's components and one seed, as resume and cross_version train
it: the model, optimizer, scheduler and loader, each step traced, and every piece a resume restores
read back as this rank holds it."""

from __future__ import annotations

import copy
import math
import random

import torch

from torchmatrix.testing import (
    ResumeOptions,
    build_optimizer,
    call_accepting,
    capture_rng_state,
    implementation_of,
    load,
    restore_rng_state,
    rng_streams,
    state_dict_root,
)

from ..checkpoints.checkpointer_forms import RunCheckpointer
from ..components.parallelize_component import parallelized
from ..components.scheduler_component import build_scheduler, scheduler_position
from ..components.stack_loader import StackLoader
from ..components.training_step import build_training_step
from ..references.optimizer_twin import OptimizerSteps, build_twin
from ..state.built_names import named_modules_as_built, named_parameters_as_built
from ..state.device_copies import on_device
from ..state.optimizer_state import local_part, optimizer_attributes, optimizer_state_of, param_groups_of, state_adapter
from ..state.owned_generators import generator_state, owned_generators, set_generator_state, state_bytes
from .step_trace import digest, digests

try:
    import numpy
except ImportError:
    numpy = None


class TrainingRun:
    """Model, optimizer, scheduler and loader built from the cell's components and one seed.

    The model is initialised from `seed` (identically on every rank); dropout then draws from
    `seed + 1 + rank` under option `seeding = "per_rank"`, so ranks mask differently, as they do in
    real data-parallel training, or from `seed + 1` on every rank under `"replicated"`. `rank` and
    `world_size` are data-parallel (torchmatrix.testing.data_parallel_rank): the ranks of a
    tensor-parallel group read the same batches and draw the same masks, as their layers' slices need.
    """

    def __init__(
        self,
        cell: dict,
        options: ResumeOptions,
        components: dict,
        data_path: str,
        rank: int,
        world_size: int,
        *,
        seed: int,
        implementation: str | None = None,
    ):
        from torchmatrix.testing import current_device

        self.device = current_device()
        param_dtype = torch.bfloat16 if cell["optimizer"] in options.bf16_param_optimizers else torch.float32
        torch.manual_seed(seed)
        model = load(components["model"])(cell, dropout=options.dropout, dtype=param_dtype)
        self.model = parallelized(components, model, cell, device=self.device)
        self.factory = load(components[f"optimizer_{cell['optimizer']}"])
        self.hyperparameters = dict(lr=options.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=options.weight_decay)
        self.implementation = implementation or implementation_of(cell)
        self.optimizer = build_optimizer(
            self.factory, self.model, **self.hyperparameters, implementation=self.implementation
        )
        self.watch: OptimizerSteps | None = None
        self.plain_state = state_adapter(components, cell["optimizer"])
        self.scheduler = build_scheduler(
            components, self.optimizer, warmup_steps=options.warmup_steps, total_steps=options.steps, cell=cell
        )
        self.training_step = build_training_step(components, model=self.model, optimizer=self.optimizer, cell=cell)
        self.batch_keywords = options.batch_keywords
        self.dataset = call_accepting(
            load(components["dataset"]), data_path, seq_len=options.seq_len, vocab_size=options.vocab_size, cell=cell
        )
        self.loader = self.dataset.loader(batch_size=options.batch_size, rank=rank, world_size=world_size)
        self.reading = StackLoader(self.loader)
        self.loader_batches = options.loader_batches or batches_past_an_epoch(options, world_size)
        dropout_seed = seed + 1 + (rank if options.seeding == "per_rank" else 0)
        torch.manual_seed(dropout_seed)
        random.seed(dropout_seed)
        if numpy is not None:
            numpy.random.seed(dropout_seed)
        self.batches: list = []
        self.trace: list[dict] = []
        self.rng_at_start = self.rng_streams()

    @property
    def generators(self) -> dict[str, object]:
        """The generators the model, dataset, loader, optimizer and scheduler own, by path (see suites/state/owned_generators.py)."""
        return owned_generators(
            {
                "model": self.model,
                "dataset": self.dataset,
                "loader": self.loader,
                "optimizer": self.optimizer,
                "scheduler": self.scheduler,
            }
        )

    def rng_streams(self) -> dict[str, bytes]:
        """The process's RNG streams and the generators this run's objects own, by name, as bytes."""
        return {**rng_streams(), **{name: state_bytes(g) for name, g in self.generators.items()}}

    @property
    def rng_streams_advanced(self) -> set[str]:
        """The RNG streams this run's steps have drawn from so far, generators created during training
        (lazily, in a first forward) included: the generators are looked for now, not only at the start."""
        now = self.rng_streams()
        return {name for name, state in now.items() if self.rng_at_start.get(name) != state}

    def train_step(self, before_optimizer_step=None) -> torch.Tensor:
        """One optimizer step; returns this rank's loss as a CPU fp32 scalar. What fed the step and
        what it made go to `trace` (suites/training_runs/step_trace.py). `before_optimizer_step` runs right before
        the optimizer steps (waiting for an asynchronous save's staging)."""
        self.model.train()
        batch = self.reading.next_batch()
        self.batches.append(on_device(batch, "cpu"))
        record = {
            "batch": {"batch": digest(self.batches[-1])},
            "lr": {
                f"param group {i} lr": digest(group["lr"]) for i, group in enumerate(param_groups_of(self.optimizer))
            },
            "non_persistent_buffers": digests(self.non_persistent_buffers()),
            "rng": self.rng_streams(),
            "parameters": digests(self.parameters()),
        }
        batch = on_device(batch, self.device)
        if self.batch_keywords and isinstance(batch, torch.Tensor):
            batch = dict.fromkeys(self.batch_keywords, batch)
        loss = self.training_step.loss(batch)
        self.training_step.backward(loss)
        record["gradients"] = {
            name: digest(local_shard(param.grad))
            for name, param in named_parameters_as_built(self.model)
            if param.grad is not None
        }
        before = self.watch.before_step() if self.watch else None
        if before_optimizer_step:
            before_optimizer_step()
        self.training_step.optimizer_step()
        if self.watch:
            self.watch.after_step(before)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        record["updated"] = digests(self.parameters())
        self.trace.append(record)
        return loss.detach().float().cpu()

    def watch_steps(self, keep: tuple[int, ...], twin: bool = False) -> None:
        """From now on keep the optimizer steps numbered `keep` (from 1), and with `twin` compare each
        step with the factory's for-loop build (suites/references/optimizer_twin.py)."""
        built = build_twin(self.factory, self.model, self.implementation, **self.hyperparameters) if twin else None
        unavailable = built if isinstance(built, str) else None
        self.watch = OptimizerSteps(self.model, self.optimizer, None if unavailable else built, keep, unavailable)

    def checkpointables(self) -> dict:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler, "loader": self.loader}

    def load_checkpoint(self, checkpointer, directory: str, cell: dict | None = None) -> tuple[int, dict]:
        """Load `directory` through the `checkpointer` component into this run, then read the loader
        anew from where its own load put it (StackLoader.reopen); the step and extra state loaded."""
        loaded = RunCheckpointer(checkpointer, directory, **self.checkpointables(), cell=cell).load()
        self.reading.reopen()
        return loaded

    def read_batches(self, count: int) -> list:
        """The next `count` batches, on the CPU, read as training reads them (the run moves on)."""
        return [on_device(self.reading.next_batch(), "cpu") for _ in range(count)]

    def parameters(self) -> dict[str, torch.Tensor]:
        """This rank's shard of every parameter, by the model's own name, copied to the CPU."""
        return {name: local_shard(param) for name, param in named_parameters_as_built(self.model)}

    def non_persistent_buffers(self) -> dict[str, torch.Tensor]:
        """This rank's copy of every buffer the model keeps out of its state dict (`persistent=False`:
        a curriculum step, a running statistic), by name, on the CPU: a checkpoint of the state
        dict leaves them as a fresh build has them."""
        return {
            f"{name}.{buffer_name}" if name else buffer_name: local_shard(module._buffers[buffer_name])
            for name, module in named_modules_as_built(self.model)
            for buffer_name in sorted(module._non_persistent_buffers_set)
            if module._buffers.get(buffer_name) is not None
        }

    def named_raw_state(self) -> dict[str, dict]:
        """The optimizer's state by parameter name, as the optimizer holds it."""
        names = {id(param): name for name, param in named_parameters_as_built(self.model)}
        return {names[id(param)]: state for param, state in optimizer_state_of(self.optimizer).items()}

    def optimizer_state(self) -> dict[str, dict]:
        """This rank's shard of every optimizer state value, by parameter name, as the state adapter
        makes it plain, copied to the CPU."""
        return {
            name: {
                key: value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else value
                for key, value in self.plain_state(state).items()
            }
            for name, state in self.named_raw_state().items()
        }

    def optimizer_state_dtype_device(self) -> dict[str, dict[str, tuple[str, str]]]:
        """Per parameter name and state key, the dtype and device of each state tensor as the
        optimizer holds it (a DTensor's local shard's device), before any state adapter or copy."""
        return {
            name: {
                key: (str(value.dtype), str(local_part(value).device))
                for key, value in state.items()
                if isinstance(value, torch.Tensor)
            }
            for name, state in self.named_raw_state().items()
        }

    def state_snapshot(self, next_batches: list | None = None) -> dict:
        """Every piece a resume must restore, as this rank sees it now (a collective: full parameters);
        `next_batches`, where given, stands for the loader's look-ahead (see _straight_and_resumed)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(state_dict_root(self.model), options=StateDictOptions(full_state_dict=True))
        return {
            "parameters": {name: value.detach().to("cpu", copy=True) for name, value in full.items()},
            "parameter_shards": self.parameters(),
            "optimizer_state": self.optimizer_state(),
            "optimizer_state_dtype_device": self.optimizer_state_dtype_device(),
            "param_groups": [
                {key: copied(value) for key, value in group.items() if key != "params"}
                for group in param_groups_of(self.optimizer)
            ],
            "optimizer_attributes": optimizer_attributes(
                self.optimizer, {id(param): name for name, param in named_parameters_as_built(self.model)}
            ),
            "scheduler": scheduler_position(self.scheduler),
            "next_batches": self.peek_next_batches() if next_batches is None else next_batches,
            "rng": self.rng_streams(),
        }

    def peek_next_batches(self) -> list[torch.Tensor]:
        """The `loader_batches` batches the loader yields next (StackLoader.batches_ahead); RNG streams
        and the generators the run owns are put back too, in case the loader draws from them."""
        generators = capture_rng_state()
        owned = {name: (g, copy.deepcopy(generator_state(g))) for name, g in self.generators.items()}
        batches = self.reading.batches_ahead(self.loader_batches, self.dataset)
        restore_rng_state(generators)
        for generator, state in owned.values():
            set_generator_state(generator, state)
        return batches


def copied(value):
    """A tensor cloned (a param group's tensor LR is updated in place by the scheduler); anything else as it is."""
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a state tensor on the CPU, dequantized when it is a tensor subclass
    that stores something else than its values (a float8 tensor of TransformerEngine, say)."""
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    if type(local) not in (torch.Tensor, torch.nn.Parameter) and hasattr(local, "dequantize"):
        local = local.dequantize()
    return local.detach().to("cpu", copy=True)


def write_dataset(components: dict, options: ResumeOptions, path: str) -> None:
    """The on-disk dataset the training runs read, the same for every run and torch version (seed 0)."""
    load(components["dataset"]).write(
        path,
        vocab_size=options.vocab_size,
        num_sequences=options.num_sequences,
        seq_len=options.seq_len,
        seed=0,
    )


def batches_past_an_epoch(options: ResumeOptions, world_size: int) -> int:
    """How many batches to compare after the load so that they cross an epoch boundary wherever the
    resume falls: one epoch's worth of this world size's global batches, and one more."""
    return math.ceil(options.num_sequences / (options.batch_size * world_size)) + 1
