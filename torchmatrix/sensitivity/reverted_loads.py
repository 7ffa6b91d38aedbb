"""The checkpointer wrappers that undo part of what a load restored, and the fresh state they put
back: the load mutants compare it bit for bit with what the load left, acting only where they differ."""

from __future__ import annotations

from torchmatrix.components.loading import load
from torchmatrix.ranks.bitwise import bits_equal
from torchmatrix.ranks.rng_state import capture_rng_state, restore_rng_state
from torchmatrix.sensitivity.evidence import record_acted

RESTORED_PIECES = ("model", "optimizer", "scheduler", "loader", "rng")


class FreshState:
    """What freshly built training objects and this process's RNGs hold before a load, so a mutant
    can put one piece back afterwards, as a checkpointer that never restored it would leave it."""

    def __init__(self, *, model, optimizer, scheduler, loader):
        import copy

        self.model, self.optimizer, self.scheduler, self.loader = model, optimizer, scheduler, loader
        self.saved = {
            "model": [local_tensor(p).detach().clone() for p in model.parameters()],
            "optimizer": copy.deepcopy(optimizer.state_dict()),
            "scheduler": copy.deepcopy(scheduler.state_dict()),
            "loader": copy.deepcopy(loader.state_dict()),
            "rng": capture_rng_state(),
        }

    def current(self, piece: str):
        """What `piece` holds now, in the form `saved` keeps it."""
        import copy

        if piece == "model":
            return [local_tensor(p).detach().clone() for p in self.model.parameters()]
        if piece == "rng":
            return capture_rng_state()
        return copy.deepcopy(getattr(self, piece).state_dict())

    def put_back(self, piece: str) -> None:
        import torch

        saved = self.saved[piece]
        if piece == "model":
            with torch.no_grad():
                for param, fresh in zip(self.model.parameters(), saved):
                    local_tensor(param).copy_(fresh)
        elif piece == "optimizer":
            self.optimizer.load_state_dict(saved)
        elif piece == "scheduler":
            self.scheduler.load_state_dict(saved)
        elif piece == "loader":
            self.loader.load_state_dict(saved)
        else:
            restore_rng_state(saved)


class RevertingCheckpointer:
    """Delegates to the per-call checkpointer at `inner`; after its load, puts `reverted(rank)` back as
    the fresh objects had them. Subclasses made by `skips_on_load` / `restores_on_rank_zero_only`."""

    inner: str = ""

    def __init__(self):
        self.wrapped = load(self.inner)()

    @staticmethod
    def reverted(rank: int) -> tuple[str, ...]:
        raise NotImplementedError

    def save(self, directory: str, *, model, optimizer, scheduler, loader, step: int):
        return self.wrapped.save(
            directory, model=model, optimizer=optimizer, scheduler=scheduler, loader=loader, step=step
        )

    def load(self, directory: str, *, model, optimizer, scheduler, loader):
        fresh = FreshState(model=model, optimizer=optimizer, scheduler=scheduler, loader=loader)
        returned = self.wrapped.load(directory, model=model, optimizer=optimizer, scheduler=scheduler, loader=loader)
        put_back(fresh, self.reverted)
        return returned


class BoundRevertingCheckpointer:
    """RevertingCheckpointer for a bound checkpointer at `inner`: built as it is (the subclass carries
    its signature, so the suites pass it the same keywords), and after its `load()` puts
    `reverted(rank)` back as the fresh objects had them."""

    inner: str = ""

    def __init__(self, directory: str, **objects_and_group):
        self.fresh_objects = {name: objects_and_group[name] for name in ("model", "optimizer", "scheduler", "loader")}
        self.wrapped = load(self.inner)(directory, **objects_and_group)

    @staticmethod
    def reverted(rank: int) -> tuple[str, ...]:
        raise NotImplementedError

    def save(self, step: int):
        return self.wrapped.save(step)

    def load(self):
        fresh = FreshState(**self.fresh_objects)
        returned = self.wrapped.load()
        put_back(fresh, self.reverted)
        return returned


def put_back(fresh: FreshState, reverted) -> None:
    """Put this rank's `reverted(rank)` pieces back as the fresh objects had them, marking the
    mutant as having acted where the load had changed one."""
    import torch.distributed as dist

    for piece in reverted(dist.get_rank() if dist.is_initialized() else 0):
        if not same_state(fresh.current(piece), fresh.saved[piece]):
            record_acted()
        fresh.put_back(piece)


def same_state(first, second) -> bool:
    """Whether two captures of a piece of state are equal, tensors bit for bit."""
    import torch

    if isinstance(first, torch.Tensor) or isinstance(second, torch.Tensor):
        return (
            isinstance(first, torch.Tensor)
            and isinstance(second, torch.Tensor)
            and bits_equal(local_tensor(first), local_tensor(second))
        )
    if isinstance(first, dict) and isinstance(second, dict):
        return first.keys() == second.keys() and all(same_state(first[key], second[key]) for key in first)
    if isinstance(first, (list, tuple)) and isinstance(second, (list, tuple)):
        return len(first) == len(second) and all(same_state(a, b) for a, b in zip(first, second))
    if hasattr(first, "tobytes") and hasattr(second, "tobytes"):
        return type(first) is type(second) and first.tobytes() == second.tobytes()
    try:
        return bool(first == second)
    except (TypeError, ValueError, RuntimeError):
        return False


def local_tensor(tensor):
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
