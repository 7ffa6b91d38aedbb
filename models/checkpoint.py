"""The reference checkpointer: everything a training run needs to resume bit-exactly, in one DCP
checkpoint.

Model and optimizer go through torch.distributed.checkpoint.state_dict's getters and setters.
The getters build a load template with the optimizer's lazily-created moments already
allocated in the right FSDP/DTensor layout, which is what a raw `optimizer.state_dict()` of a
fresh optimizer lacks (see shared/seeds/resume-optimizer-moments.txt). Next to them go the LR
scheduler, the data-loader position and the step, which are the same on every rank, and each
rank's RNG states, which are not. `BoundCheckpointer` is the same checkpoint in the form of a
checkpoint manager: built once with the training objects and a process group, then `save(step)`
and `load()`.
"""

from __future__ import annotations

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from torchmatrix.testing import capture_rng_state, restore_rng_state


class Checkpointer:
    """The `checkpointer` component: `save(directory, ...)` and `load(directory, ...) -> step`.

    Both are collectives: call them on every rank with the same directory. The model may be
    plain, FSDP1-wrapped or FSDP2-sharded; the optimizer anything torch's state-dict helpers
    handle. A resume needs the world size it was saved at, because RNG states are per rank.
    Each piece is its own method so the mutants in models/mutants/resume.py can break one.
    `process_group` is the group DCP saves and loads over (None: every rank).
    """

    process_group = None

    def save(self, directory: str, *, model, optimizer, scheduler, loader, step: int) -> None:
        state = self.state_to_save(model=model, optimizer=optimizer, scheduler=scheduler, loader=loader, step=step)
        dcp.save(state, checkpoint_id=directory, process_group=self.process_group)

    def state_to_save(self, *, model, optimizer, scheduler, loader, step: int) -> dict:
        """Every piece, keyed as `restore` loads it; the progress checked alike on every rank first."""
        progress = self.progress_state(scheduler, loader, step)
        require_same_on_every_rank(progress, self.process_group)
        return {
            "model": self.model_state(model),
            "optimizer": self.optimizer_state(model, optimizer),
            "progress": progress,
            self.rng_key(): self.rng_state(),
        }

    def load(self, directory: str, *, model, optimizer, scheduler, loader) -> int:
        """Restore every piece from `directory` and return the step it was saved at."""
        return int(
            self.restore(directory, model=model, optimizer=optimizer, scheduler=scheduler, loader=loader)["step"]
        )

    def restore(self, directory: str, *, model, optimizer, scheduler, loader) -> dict:
        """Restore every piece from `directory` and return the progress saved with it (step, scheduler, loader, ...).

        Gradients are dropped first: torch's state-dict getter only allocates the lazily-created
        moments of an optimizer whose params have no gradients, so stale gradients would
        silently make the load skip the moments (and would be stale after the load anyway).
        """
        optimizer.zero_grad(set_to_none=True)
        state = {
            "model": self.model_state(model),
            "optimizer": self.optimizer_state(model, optimizer),
            "progress": self.progress_state(scheduler, loader, step=0),
            self.rng_key(): capture_rng_state(),
        }
        dcp.load(state, checkpoint_id=directory, process_group=self.process_group)
        self.restore_model(model, state["model"])
        self.restore_optimizer(model, optimizer, state["optimizer"])
        self.restore_scheduler(scheduler, state["progress"]["scheduler"])
        self.restore_loader(loader, state["progress"]["loader"])
        self.restore_rng(state[self.rng_key()])
        return state["progress"]

    def model_state(self, model) -> dict:
        return get_model_state_dict(model)

    def optimizer_state(self, model, optimizer) -> dict:
        """Sharded and keyed by parameter name; the moments are allocated even before the first
        step, so DCP has tensors to load them into."""
        return get_optimizer_state_dict(model, optimizer)

    def restore_model(self, model, state: dict) -> None:
        set_model_state_dict(model, state)

    def restore_optimizer(self, model, optimizer, state: dict) -> None:
        set_optimizer_state_dict(model, optimizer, state)

    def progress_state(self, scheduler, loader, step: int) -> dict:
        return {"step": step, "scheduler": scheduler.state_dict(), "loader": loader.state_dict()}

    def restore_scheduler(self, scheduler, state: dict) -> None:
        scheduler.load_state_dict(state)

    def restore_loader(self, loader, state: dict) -> None:
        loader.load_state_dict(state)

    def restore_rng(self, state: dict) -> None:
        restore_rng_state(state)

    def rng_state(self) -> dict:
        return capture_rng_state()

    def rng_key(self) -> str:
        """Checkpoint key of this rank's RNG states: one key per rank, because DCP keeps a single
        copy of a key that every rank saves."""
        return f"rng_rank{dist.get_rank() if dist.is_initialized() else 0}"


class ReplicatedRngCheckpointer(Checkpointer):
    """The reference checkpoint with one copy of the RNG states, rank 0's, and the tokens the
    loader has read in its progress."""

    def rng_key(self) -> str:
        return "rng"

    def rng_state(self) -> dict:
        """Rank 0's RNG states (the group's first rank), on every rank: DCP keeps one copy of a key
        every rank saves, and which rank's it keeps is its own choice."""
        state = [capture_rng_state()]
        if dist.is_initialized():
            first = dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0
            dist.broadcast_object_list(state, src=first, group=self.process_group)
        return state[0]

    def progress_state(self, scheduler, loader, step: int) -> dict:
        return {**super().progress_state(scheduler, loader, step), "tokens_seen": self.tokens_seen(loader)}

    def tokens_seen(self, loader) -> int:
        """Tokens every rank together has read: the loader's global batches times their tokens (0 for
        a loader that does not say its batch size and dataset)."""
        group_size = dist.get_world_size(self.process_group) if dist.is_initialized() else 1
        per_batch = getattr(loader, "batch_size", 0) * getattr(getattr(loader, "dataset", None), "seq_len", 0)
        return loader.state_dict()["position"] * per_batch * group_size


class BoundCheckpointer:
    """The `checkpointer` component in its bound form, as a training stack's checkpoint manager is
    written: built once with the directory, the training objects and the process group it saves and
    loads over, then `save(step)` and `load()`.

    It keeps rank 0's RNG states for every rank (one `rng` key), as managers of stacks that seed
    their data-parallel replicas alike do: right under the resume suite's `seeding = "replicated"`,
    and world-size free, so the same checkpoint loads into another number of ranks. Besides the step,
    `save` and `load` return `tokens_seen`, the extra state a manager keeps of its trainer's progress.
    """

    pieces_class = ReplicatedRngCheckpointer

    def __init__(self, directory: str, *, model, optimizer, scheduler, loader, process_group=None):
        self.directory = directory
        self.objects = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader}
        self.pieces = self.pieces_class()
        self.pieces.process_group = process_group

    def save(self, step: int) -> dict:
        self.pieces.save(self.directory, step=step, **self.objects)
        return {"tokens_seen": self.pieces.tokens_seen(self.objects["loader"])}

    def load(self) -> dict:
        progress = self.pieces.restore(self.directory, **self.objects)
        return {"step": int(progress["step"]), "tokens_seen": int(progress["tokens_seen"])}


def require_same_on_every_rank(progress: dict, group=None) -> None:
    """Refuse to save a step, scheduler or loader position that differs between the ranks of
    `group` (None: all): DCP keeps one copy of them, so a disagreement would silently resume some
    ranks elsewhere."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, progress, group=group)
    differing = [rank for rank, other in enumerate(gathered) if other != gathered[0]]
    if differing:
        raise RuntimeError(
            f"training progress differs between ranks, cannot checkpoint: rank 0 has {gathered[0]}, ranks {differing} have {[gathered[r] for r in differing]}"
        )
