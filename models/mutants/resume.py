"""Known-bad components for the resume suite: each loses one piece of training state on resume,
and suites/test_resume.py must fail on every one of them.

Point `[components] checkpointer` (or `optimizer_precision_aware`) at one of these to see it caught.
"""

from __future__ import annotations

import torch

from torchmatrix.sensitivity.mutants import restores_on_rank_zero_only

from ..checkpoint import Checkpointer
from ..optim import PrecisionAwareAdamW


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
