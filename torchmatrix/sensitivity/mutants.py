"""Generic mutants: wrappers that break any `[components]` entry the way real bugs do, so that
`python -m torchmatrix sensitivity` can show the suites catching them on the user's own stack.

They run in the rank processes; torch is imported inside the functions, because every
torchmatrix module must import without it.
"""

from __future__ import annotations

from torchmatrix.components.calling import accepts
from torchmatrix.components.loading import load

RESTORED_PIECES = ("model", "optimizer", "scheduler", "loader", "rng")


class FreshState:
    """What freshly built training objects and this process's RNGs hold before a load, so a mutant
    can put one piece back afterwards, as a checkpointer that never restored it would leave it."""

    def __init__(self, *, model, optimizer, scheduler, loader):
        import copy

        self.model, self.optimizer, self.scheduler, self.loader = model, optimizer, scheduler, loader
        self.saved = {
            "model": [_local(p).detach().clone() for p in model.parameters()],
            "optimizer": copy.deepcopy(optimizer.state_dict()),
            "scheduler": copy.deepcopy(scheduler.state_dict()),
            "loader": copy.deepcopy(loader.state_dict()),
            "rng": _rng_state(),
        }

    def put_back(self, piece: str) -> None:
        import torch

        saved = self.saved[piece]
        if piece == "model":
            with torch.no_grad():
                for param, fresh in zip(self.model.parameters(), saved):
                    _local(param).copy_(fresh)
        elif piece == "optimizer":
            self.optimizer.load_state_dict(saved)
        elif piece == "scheduler":
            self.scheduler.load_state_dict(saved)
        elif piece == "loader":
            self.loader.load_state_dict(saved)
        else:
            _set_rng_state(saved)


class RevertingCheckpointer:
    """Delegates to the checkpointer at `inner`; after its load, puts `reverted(rank)` back as the
    fresh objects had them. Subclasses made by `skips_on_load` / `restores_on_rank_zero_only`."""

    inner: str = ""

    def __init__(self):
        self.wrapped = load(self.inner)()

    @staticmethod
    def reverted(rank: int) -> tuple[str, ...]:
        raise NotImplementedError

    def save(self, directory: str, *, model, optimizer, scheduler, loader, step: int) -> None:
        self.wrapped.save(directory, model=model, optimizer=optimizer, scheduler=scheduler, loader=loader, step=step)

    def load(self, directory: str, *, model, optimizer, scheduler, loader) -> int:
        import torch.distributed as dist

        fresh = FreshState(model=model, optimizer=optimizer, scheduler=scheduler, loader=loader)
        step = self.wrapped.load(directory, model=model, optimizer=optimizer, scheduler=scheduler, loader=loader)
        for piece in self.reverted(dist.get_rank() if dist.is_initialized() else 0):
            fresh.put_back(piece)
        return step


def skips_on_load(inner: str, piece: str) -> type[RevertingCheckpointer]:
    """The checkpointer at `inner`, except that a load leaves `piece` as the fresh objects had it."""
    if piece not in RESTORED_PIECES:
        raise ValueError(f"piece {piece!r}: expected one of {', '.join(RESTORED_PIECES)}")
    return type(
        f"Skips{piece.title()}OnLoad",
        (RevertingCheckpointer,),
        {"inner": inner, "reverted": staticmethod(lambda rank: (piece,))},
    )


def restores_on_rank_zero_only(inner: str) -> type[RevertingCheckpointer]:
    """The checkpointer at `inner`, except that only rank 0 keeps what it loaded; every other rank
    resumes with freshly built state (at world size 1 this is the correct checkpointer)."""
    return type(
        "RestoresOnRankZeroOnly",
        (RevertingCheckpointer,),
        {"inner": inner, "reverted": staticmethod(lambda rank: RESTORED_PIECES if rank else ())},
    )


def moments_cast_on_load(inner: str):
    """The optimizer factory at `inner`, whose `load_state_dict` then casts every floating state
    tensor but `step` to its param's dtype, as torch's default `Optimizer.load_state_dict` does:
    fp32 masters and moments of bf16 params come back rounded."""

    def build(params, *, named_parameters=None, **kwargs):
        import torch

        factory = load(inner)
        if named_parameters is not None and accepts(factory, "named_parameters"):
            kwargs["named_parameters"] = named_parameters
        optimizer = factory(params, **kwargs)
        load_exactly = optimizer.load_state_dict

        def load_state_dict(state_dict):
            load_exactly(state_dict)
            for param, state in optimizer.state.items():
                for key, value in state.items():
                    if key != "step" and torch.is_tensor(value) and value.is_floating_point():
                        state[key] = value.to(param.dtype)

        optimizer.load_state_dict = load_state_dict
        return optimizer

    return build


def counts_body_runs_in_buffer(inner: str):
    """The model factory at `inner`, with a buffer on the first decoder layer that its body bumps
    on every run, recompute included: a token or routing counter kept in a checkpointed layer."""

    def build(cell, **kwargs):
        import torch

        model = load(inner)(cell, **kwargs)
        layer = model.decoder_layers()[0]
        layer.register_buffer("mutant_body_runs", torch.zeros((), dtype=torch.int64))

        def bump(module, args):
            with torch.no_grad():
                layer.mutant_body_runs += 1

        _first_leaf(layer).register_forward_pre_hook(bump)
        return model

    return build


def counts_body_runs_on_cache(inner: str):
    """The model factory at `inner`, whose cache carries a plain int that the first decoder layer's
    body bumps on every run, recompute included, like a `seen_tokens` counter bumped per write."""

    def build(cell, **kwargs):
        model = load(inner)(cell, **kwargs)
        counter = {"runs": 0, "cache": None}

        def bump(module, args):
            counter["runs"] += 1
            if counter["cache"] is not None:
                counter["cache"].mutant_writes += 1

        _first_leaf(model.decoder_layers()[0]).register_forward_pre_hook(bump)
        forward = model.forward

        def counting_forward(*args, **kwargs):
            counter["runs"], counter["cache"] = 0, None
            output = forward(*args, **kwargs)
            cache = getattr(output, "past_key_values", None)
            if cache is not None:
                cache.mutant_writes = counter["runs"]
                counter["cache"] = cache
            return output

        model.forward = counting_forward
        return model

    return build


def _first_leaf(layer):
    """The first submodule of `layer` holding parameters of its own: it runs whenever the layer's
    body runs, also when a checkpoint wrapper around the layer recomputes it."""
    for module in layer.modules():
        if module is not layer and next(module.parameters(recurse=False), None) is not None:
            return module
    raise ValueError(f"{type(layer).__name__} has no submodule with parameters to count body runs on")


def _local(tensor):
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _rng_state() -> dict:
    import random

    import torch

    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy
    except ImportError:
        return state
    state["numpy"] = numpy.random.get_state()
    return state


def _set_rng_state(state: dict) -> None:
    import random

    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
