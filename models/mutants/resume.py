"""Known-bad components for the resume suite: each loses one piece of training state on resume,
and suites/test_resume.py must fail on every one of them.

Point `[components] checkpointer` (or `optimizer_precision_aware`) at one of these to see it caught.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from torchmatrix.sensitivity.mutants import restores_on_rank_zero_only

from ..checkpoint import BoundCheckpointer, Checkpointer
from ..data import ShardedLoader, TokenDataset
from ..optim import PrecisionAwareAdamW
from ..transformer import PrefixExpertDecoder, build_model


class RawOptimizerStateCheckpointer(Checkpointer):
    """The seed's bug: round-trips `optimizer.state_dict()` itself. A freshly built optimizer has
    no moments yet (they are created on the first step), so the load template has nothing for
    DCP to fill, the saved moments are dropped and training resumes with zero momentum."""

    def optimizer_state(self, model, optimizer) -> dict:
        return optimizer.state_dict()

    def restore_optimizer(self, model, optimizer, state: dict) -> None:
        optimizer.load_state_dict(state)


class RngNotRestoredCheckpointer(Checkpointer):
    """Saves the RNG states but never restores them, so dropout masks after a resume differ."""

    def restore_rng(self, state: dict) -> None:
        pass


class SchedulerNotRestoredCheckpointer(Checkpointer):
    """Never restores the LR scheduler, so warm-up restarts from its first step after a resume."""

    def restore_scheduler(self, scheduler, state: dict) -> None:
        pass


class DataPositionNotRestoredCheckpointer(Checkpointer):
    """Never restores the loader position, so a resumed run re-reads the first batches."""

    def restore_loader(self, loader, state: dict) -> None:
        pass


class ParamGroupsNotRestoredCheckpointer(Checkpointer):
    """Restores the optimizer's per-parameter state but keeps the freshly built optimizer's param
    groups (a load that takes only `state` from the checkpoint): the lr the scheduler had set is
    back at warm-up's first value until the next `scheduler.step()`."""

    def restore_optimizer(self, model, optimizer, state: dict) -> None:
        fresh = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
        super().restore_optimizer(model, optimizer, state)
        for group, hyperparameters in zip(optimizer.param_groups, fresh):
            group.update(hyperparameters)


class SchedulerOneStepLateCheckpointer(Checkpointer):
    """Restores the LR scheduler, then steps it once more (a resume that replays the save step's
    `scheduler.step()`): warm-up and decay run one step ahead for the rest of training."""

    def restore_scheduler(self, scheduler, state: dict) -> None:
        super().restore_scheduler(scheduler, state)
        scheduler.step()


class LoaderOneBatchLateCheckpointer(Checkpointer):
    """Restores the loader, then skips one batch (a position saved before the step's `next()`
    was counted): every resumed step reads the batch after the one it should."""

    def restore_loader(self, loader, state: dict) -> None:
        super().restore_loader(loader, state)
        next(loader)


class StepOnlyBoundCheckpointer(BoundCheckpointer):
    """Writes `tokens_seen` with the checkpoint and reports it from `save`, but its `load` returns only
    the step (a manager whose load kept the per-call protocol's `-> int` habit): the resumed trainer's
    token count, and whatever it schedules by it, restarts from nothing."""

    def load(self) -> dict:
        return {"step": super().load()["step"]}


RankZeroOnlyCheckpointer = restores_on_rank_zero_only("torchmatrix.models.checkpoint:Checkpointer")
"""Loads on every rank, but only rank 0 keeps what it loaded (a restore guarded by `if rank == 0`,
or a rank-0 read that is never broadcast): the other ranks resume from freshly built state."""


class CastOnLoadPrecisionAwareAdamW(PrecisionAwareAdamW):
    """Loads state with torch's default `Optimizer.load_state_dict`, which casts every floating
    state tensor to the param dtype: the fp32 master (and moments kept wider than the param)
    come back rounded to bf16."""

    load_state_dict = torch.optim.Optimizer.load_state_dict


def build_cast_on_load_precision_aware(
    params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, moment_dtype=torch.bfloat16
) -> CastOnLoadPrecisionAwareAdamW:
    """Factory with the signature of torchmatrix.models.optim.build_precision_aware."""
    return CastOnLoadPrecisionAwareAdamW(
        params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, moment_dtype=moment_dtype
    )


class StepCountingPrecisionAwareAdamW(PrecisionAwareAdamW):
    """Counts its steps on the optimizer object and bias-corrects with that count instead of each
    state's `step`: the count is in no state dict, so a resumed run restarts bias correction from 1.
    Like a hybrid Muon/AdamW optimizer it also keeps `{param: ...}` tables on itself: `matrix_params`,
    fixed when it is built (a fresh build reproduces it, so a resume must not flag it), and
    `updates_per_param`, counted per step and in no state dict either (a resume must name it per param)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps_taken = 0
        self.rounding_generator = seeded_generator()
        params = [param for group in self.param_groups for param in group["params"]]
        self.matrix_params = {param: param.dim() >= 2 for param in params}
        self.updates_per_param = dict.fromkeys(params, 0)

    @torch.no_grad()
    def step(self, closure=None):
        self.steps_taken += 1
        torch.rand((), generator=self.rounding_generator)  # a stochastic-rounding draw: the stream moves every step
        return super().step(closure)

    def _update(self, param: torch.Tensor, group: dict) -> None:
        state = self.state[param]
        if not state:
            state.update(self._initial_state(param))
        state["step"].fill_(self.steps_taken - 1)
        self.updates_per_param[param] += 1
        super()._update(param, group)


def build_step_counting_precision_aware(
    params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, moment_dtype=torch.bfloat16
) -> StepCountingPrecisionAwareAdamW:
    """Factory with the signature of torchmatrix.models.optim.build_precision_aware."""
    return StepCountingPrecisionAwareAdamW(
        params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, moment_dtype=moment_dtype
    )


class GeneratorDropout(nn.Module):
    """Dropout drawing its masks from a `torch.Generator` of its own, seeded from the global RNG when
    built (as a module keeping a per-layer generator does), or, `lazy`, in its first forward; no
    checkpointer saves it."""

    def __init__(self, p: float, *, lazy: bool = False) -> None:
        super().__init__()
        self.p = p
        self.generator = None if lazy else seeded_generator()

    def forward(self, hidden: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return hidden
        if self.generator is None:
            self.generator = seeded_generator()
        keep = torch.rand(hidden.shape, generator=self.generator) >= self.p
        return hidden * keep.to(hidden.device, hidden.dtype) / (1 - self.p)


def seeded_generator() -> torch.Generator:
    """A CPU generator seeded from the global RNG."""
    return torch.Generator().manual_seed(int(torch.randint(2**62, ()).item()))


def own_generator_dropout_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> PrefixExpertDecoder:
    """Model factory: the reference decoder whose dropout layers draw from generators they own, made
    when built in the prefix layers and in the first forward in the expert layers, and which counts
    its training forwards in a non-persistent buffer."""
    model = build_model(cell, dropout=dropout, dtype=dtype)
    for layer in model.prefix_layers:
        layer.dropout = GeneratorDropout(dropout)
    for layer in model.expert_layers:
        layer.dropout = GeneratorDropout(dropout, lazy=True)
    model.register_buffer("curriculum_step", torch.zeros((), dtype=torch.int64), persistent=False)
    model.register_forward_pre_hook(advance_curriculum)
    return model


def advance_curriculum(model: nn.Module, args) -> None:
    """A curriculum step kept in a non-persistent buffer, which no state dict holds: one more per training forward."""
    if model.training:
        model.curriculum_step += 1


class ReshufflingLoader(ShardedLoader):
    """Reads the first epoch in file order and every later one in an order shuffled from a seed drawn
    from the global RNG when the loader is built. Its state dict saves its position (so the epoch
    too), not that seed: a resumed run reads the right batches until the next epoch boundary, then
    another order."""

    def __init__(self, dataset: TokenDataset, **kwargs) -> None:
        super().__init__(dataset, **kwargs)
        self.shuffle_seed = int(torch.randint(2**62, ()).item())

    def __next__(self) -> torch.Tensor:
        global_batch = self.batch_size * self.world_size
        per_epoch = len(self.dataset) // global_batch
        epoch, step = divmod(self.position, per_epoch)
        order = torch.arange(len(self.dataset))
        if epoch:
            order = torch.randperm(
                len(self.dataset), generator=torch.Generator().manual_seed(self.shuffle_seed + epoch)
            )
        first = step * global_batch + self.rank * self.batch_size
        self.position += 1
        return self.dataset.tokens[order[first : first + self.batch_size]]


class ReshufflingTokenDataset(TokenDataset):
    """The `dataset` component whose loader reshuffles every epoch from a seed it does not save."""

    def loader(self, *, batch_size: int, rank: int, world_size: int) -> ReshufflingLoader:
        return ReshufflingLoader(self, batch_size=batch_size, rank=rank, world_size=world_size)


def boost_recomputed_late_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> PrefixExpertDecoder:
    """Model factory: the reference decoder whose embedding output is scaled by 1 + a boost that
    halves every training forward. The boost is a non-persistent buffer, recomputed after a load
    from the persistent count of forwards, one forward late (as a cache rebuilt from a step counter
    read off by one): the first resumed step runs with the boost of the step before."""
    model = build_model(cell, dropout=dropout, dtype=dtype)
    model.embed.register_buffer("forwards_done", torch.zeros((), dtype=torch.int64))
    model.embed.register_buffer("boost", torch.ones(()), persistent=False)
    model.embed.register_forward_hook(boost_embeddings)
    model.embed.register_load_state_dict_post_hook(recompute_boost_one_forward_late)
    return model


def boost_embeddings(embed: nn.Module, args, output: Tensor) -> Tensor:
    """Scale the embeddings by 1 + the boost, then, in training, count the forward and halve the boost."""
    boosted = output * (1 + embed.boost.to(output.dtype))
    if embed.training:
        embed.forwards_done += 1
        embed.boost.fill_(0.5 ** int(embed.forwards_done))
    return boosted


def recompute_boost_one_forward_late(embed: nn.Module, incompatible_keys) -> None:
    """The bug: the boost as it was one forward before the loaded count (`0.5 ** (count - 1)`)."""
    embed.boost.fill_(0.5 ** max(int(embed.forwards_done) - 1, 0))
