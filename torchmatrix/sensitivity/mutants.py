"""Generic mutants: wrappers that break any `[components]` entry the way real bugs do, so that
`python -m torchmatrix sensitivity` can show the suites catching them on the user's own stack.

They run in the rank processes; torch is imported inside the functions, because every
torchmatrix module must import without it. Each mutant records, per cell, that it acted (its hook
ran during a recompute, its load skip undid something the real load restored, ...) with
`record_acted`, so the command calls a pass "missed" only where the bug was really there.
"""

from __future__ import annotations

import types
from collections.abc import Mapping

from torchmatrix.components.calling import accepts, call_accepting, is_bound_checkpointer
from torchmatrix.components.loading import load
from torchmatrix.components.optimizer_implementations import (
    DEFAULT_IMPLEMENTATION,
    UnavailableImplementation,
    implementation_not_named,
)
from torchmatrix.components.optimizer_like import inner_optimizers
from torchmatrix.ranks.bitwise import bits_equal
from torchmatrix.sensitivity.evidence import record_acted, record_cannot_act
from torchmatrix.sensitivity.reverted_loads import (
    RESTORED_PIECES,
    BoundRevertingCheckpointer,
    RevertingCheckpointer,
)


def reverting(name: str, inner: str, reverted) -> type:
    """A checkpointer class of the form the one at `inner` has, reverting `reverted(rank)` after each load."""
    import inspect

    factory = load(inner)
    if not is_bound_checkpointer(factory):
        return type(name, (RevertingCheckpointer,), {"inner": inner, "reverted": staticmethod(reverted)})
    attributes = {"inner": inner, "reverted": staticmethod(reverted), "__signature__": inspect.signature(factory)}
    return type(name, (BoundRevertingCheckpointer,), attributes)


def skips_on_load(inner: str, piece: str) -> type:
    """The checkpointer at `inner`, except that a load leaves `piece` as the fresh objects had it."""
    if piece not in RESTORED_PIECES:
        raise ValueError(f"piece {piece!r}: expected one of {', '.join(RESTORED_PIECES)}")
    return reverting(f"Skips{piece.title()}OnLoad", inner, lambda rank: (piece,))


def restores_on_rank_zero_only(inner: str) -> type:
    """The checkpointer at `inner`, except that only rank 0 keeps what it loaded; every other rank
    resumes with freshly built state (at world size 1 this is the correct checkpointer)."""
    return reverting("RestoresOnRankZeroOnly", inner, lambda rank: RESTORED_PIECES if rank else ())


def moments_cast_on_load(inner: str):
    """The optimizer factory at `inner`, whose `load_state_dict` then casts every floating state
    tensor but `step` to its param's dtype, as torch's default `Optimizer.load_state_dict` does:
    fp32 masters and moments of bf16 params come back rounded."""

    def cast_moments(optimizer):
        import torch

        states = [item for part in inner_optimizers(optimizer) for item in part.state.items()]
        for param, state in states:
            for key, value in state.items():
                if key != "step" and torch.is_tensor(value) and value.is_floating_point():
                    if value.dtype != param.dtype:
                        record_acted()
                    state[key] = value.to(param.dtype)

    return _altering_after_load(inner, cast_moments)


def counts_body_runs_in_buffer(inner: str):
    """The model factory at `inner`, with a buffer on every decoder layer that each run of a module
    inside it bumps, recompute included: a token or routing counter kept in a checkpointed layer."""

    def build(cell, **kwargs):
        import torch

        model = load(inner)(cell, **kwargs)
        for layer in _layers(model):
            layer.register_buffer("mutant_body_runs", torch.zeros((), dtype=torch.int64))

            def bump(module, args, layer=layer):
                _note_if_recomputing()
                with torch.no_grad():
                    layer.mutant_body_runs += 1

            _hook_every_leaf(layer, bump)
        return model

    return build


def counts_body_runs_on_cache(inner: str):
    """The model factory at `inner`, whose cache carries a plain int that each run of a module inside
    a decoder layer bumps, recompute included, like a `seen_tokens` counter bumped per write."""

    def build(cell, **kwargs):
        model = load(inner)(cell, **kwargs)
        counter = {"runs": 0, "cache": None}

        def bump(module, args):
            _note_if_recomputing()
            counter["runs"] += 1
            if counter["cache"] is not None:
                _set_counter(counter["cache"], _counter(counter["cache"]) + 1)

        for layer in _layers(model):
            _hook_every_leaf(layer, bump)
        forward = model.forward

        def counting_forward(*args, **kwargs):
            counter["runs"], counter["cache"] = 0, None
            output = forward(*args, **kwargs)
            cache = output.get("past_key_values") if isinstance(output, Mapping) else None
            cache = getattr(output, "past_key_values", cache)
            if cache is not None:
                _set_counter(cache, counter["runs"])
                counter["cache"] = cache
            return output

        model.forward = counting_forward
        return model

    return build


def appends_to_list_attribute(inner: str):
    """The model factory at `inner`, whose decoder layers append to a plain list attribute on each run
    of a module inside them, recompute included: an aux-loss list a trainer sums after the step."""

    def build(cell, **kwargs):
        model = load(inner)(cell, **kwargs)
        for layer in _layers(model):
            layer.mutant_aux_losses = []

            def append(module, args, layer=layer):
                _note_if_recomputing()
                layer.mutant_aux_losses.append(len(layer.mutant_aux_losses))

            _hook_every_leaf(layer, append)
        return model

    return build


def holds_inputs_across_calls(inner: str):
    """The model factory at `inner`, whose modules inside the decoder layers keep their last forward
    input on themselves and, when recomputed in backward, run on that instead of the one given: a
    cache held across calls. Right for one forward then its backward; with two micro-batches
    forward before one backward, micro-batch 1's recompute reads micro-batch 2's input."""

    def build(cell, **kwargs):
        import torch

        model = load(inner)(cell, **kwargs)

        def hold_or_replay(module, args, kwargs):
            given = args[0] if args else None
            if not isinstance(given, torch.Tensor):
                return None
            if not _in_backward():
                module.mutant_held_input = given.detach()
                return None
            held = getattr(module, "mutant_held_input", None)
            if held is None or held.shape != given.shape or held.dtype != given.dtype:
                return None
            if not bits_equal(held, given):
                record_acted()
            replayed = held.detach().requires_grad_(given.requires_grad)

            def swapped(value):
                """The held input wherever the given one was passed: nn.MultiheadAttention's fast path needs `query is key`."""
                return replayed if value is given else value

            return tuple(map(swapped, args)), {key: swapped(value) for key, value in kwargs.items()}

        for layer in _layers(model):
            _hook_every_leaf(layer, hold_or_replay, with_kwargs=True)
        return model

    return build


def draws_from_own_generator(inner: str):
    """The model factory at `inner`, whose decoder layers scale their output by noise drawn from a
    `torch.Generator` the model owns (seeded from the global RNG when built), in training only: a
    per-module generator that no checkpointer saves."""

    def build(cell, **kwargs):
        import torch

        model = load(inner)(cell, **kwargs)
        model.mutant_generator = torch.Generator().manual_seed(int(torch.randint(2**62, ()).item()))

        def jitter(module, args, output):
            if not module.training or not isinstance(output, torch.Tensor) or not output.is_floating_point():
                return None
            noise = torch.rand(output.shape, generator=model.mutant_generator)
            record_acted()
            return output * (1 + 1e-2 * (noise.to(output.device, output.dtype) - 0.5))

        for layer in _layers(model):
            layer.register_forward_hook(jitter)
        return model

    return build


def counts_steps_on_optimizer(inner: str):
    """The optimizer factory at `inner`, whose `step()` counts steps on the optimizer object (in no state
    dict) and scales the gradients by a warm-up of that count: a resumed run restarts the warm-up."""

    def build(params, *, named_parameters=None, model=None, implementation=None, **kwargs):
        import torch

        optimizer = _built_optimizer(
            inner, params, kwargs, named_parameters=named_parameters, model=model, implementation=implementation
        )
        optimizer.mutant_steps = 0
        inner_step = optimizer.step

        def counting_step(self, *args, **kwargs):
            self.mutant_steps += 1
            warmup = 1 - 0.5**self.mutant_steps
            with torch.no_grad():
                for group in self.param_groups:
                    for param in group["params"]:
                        if param.grad is not None:
                            param.grad.mul_(warmup)
            record_acted()
            return inner_step(*args, **kwargs)

        optimizer.step = types.MethodType(counting_step, optimizer)
        return optimizer

    return build


def replicates_state_on_2d_meshes(inner: str):
    """The optimizer factory at `inner`, whose `step()` then re-wraps the state of every param on a 2-D
    mesh as `Replicate` on each dim: HSDP's state flattened to one copy per shard group, each rank's
    shard posing as the whole tensor, while the update itself ran on the right shard."""

    def build(params, *, named_parameters=None, model=None, implementation=None, **kwargs):
        optimizer = _built_optimizer(
            inner, params, kwargs, named_parameters=named_parameters, model=model, implementation=implementation
        )
        inner_step = optimizer.step

        def replicating_step(self, *args, **kwargs):
            returned = inner_step(*args, **kwargs)
            for part in inner_optimizers(optimizer):
                for state in part.state.values():
                    state.update({key: _replicated(value) for key, value in state.items()})
            return returned

        optimizer.step = types.MethodType(replicating_step, optimizer)
        return optimizer

    return build


def recasts_step_on_load(inner: str):
    """The optimizer factory at `inner`, whose `load_state_dict` then puts every tensor `step` in
    another dtype than the one loaded (float64, or float32 where it was float64): pytorch#173901's
    compiled optimizer that changed `step`'s dtype on a load, silently moving bias correction."""

    def recast_step(optimizer):
        import torch

        for part in inner_optimizers(optimizer):
            for state in part.state.values():
                step = state.get("step")
                if isinstance(step, torch.Tensor) and step.is_floating_point():
                    state["step"] = step.to(torch.float32 if step.dtype == torch.float64 else torch.float64)
                    record_acted()

    return _altering_after_load(inner, recast_step)


def _altering_after_load(inner: str, alter):
    """The optimizer factory at `inner`, whose `load_state_dict` then calls `alter(optimizer)`: the
    load-time bugs differ only in what they do to the state the real load restored."""

    def build(params, *, named_parameters=None, model=None, implementation=None, **kwargs):
        optimizer = _built_optimizer(
            inner, params, kwargs, named_parameters=named_parameters, model=model, implementation=implementation
        )
        load_exactly = optimizer.load_state_dict

        def load_state_dict(state_dict):
            load_exactly(state_dict)
            alter(optimizer)

        optimizer.load_state_dict = load_state_dict
        return optimizer

    return build


def _replicated(value):
    """A non-scalar DTensor of a 2-D mesh re-wrapped from its local shard as Replicate on every dim; anything else as is."""
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(value, DTensor) or value.device_mesh.ndim < 2 or not value.dim():
        return value
    record_acted()
    mesh = value.device_mesh
    return DTensor.from_local(value.to_local(), mesh, [Replicate()] * mesh.ndim, run_check=False)


def reshuffles_from_unsaved_seed(inner: str):
    """The dataset component at `inner`, whose loader relabels the tokens (every integer tensor of a
    batch, in a tensor, mapping, tuple or list) of every batch after the first epoch by a permutation
    seeded from the global RNG when the loader is built; its state dict keeps the loader's position,
    not that seed: a resumed run reads right until the next epoch boundary. A dataset without `len()`
    has no epoch the mutant can count, so every batch after the first is relabelled."""

    class ReshuffledDataset:
        component = load(inner)

        @classmethod
        def write(cls, *args, **kwargs):
            return cls.component.write(*args, **kwargs)

        def __init__(self, path, *, seq_len=None, vocab_size=None, cell=None):
            self.wrapped = call_accepting(self.component, path, seq_len=seq_len, vocab_size=vocab_size, cell=cell)

        def __len__(self):
            return len(self.wrapped)

        def loader(self, *, batch_size: int, rank: int, world_size: int):
            inner_loader = self.wrapped.loader(batch_size=batch_size, rank=rank, world_size=world_size)
            sized = hasattr(self.wrapped, "__len__")
            per_epoch = max(1, len(self.wrapped) // (batch_size * world_size)) if sized else 1
            return ReshuffledLoader(inner_loader, per_epoch)

    return ReshuffledDataset


class ReshuffledLoader:
    """The loader of `reshuffles_from_unsaved_seed`: counts the batches it yields (saved), relabels
    every batch from the second epoch on by a permutation of its unsaved seed and the epoch."""

    def __init__(self, wrapped, batches_per_epoch: int):
        import torch

        self.wrapped, self.batches_per_epoch, self.yielded = wrapped, batches_per_epoch, 0
        self.shuffle_seed = int(torch.randint(2**62, ()).item())

    def __iter__(self):
        return self

    def __next__(self):
        import torch

        batch = next(self.wrapped)
        epoch, self.yielded = self.yielded // self.batches_per_epoch, self.yielded + 1
        if not epoch:
            return batch
        generator = torch.Generator().manual_seed(self.shuffle_seed + epoch)
        return _relabelled(batch, generator)

    def state_dict(self) -> dict:
        return {"wrapped": self.wrapped.state_dict(), "yielded": self.yielded}

    def load_state_dict(self, state: dict) -> None:
        self.wrapped.load_state_dict(state["wrapped"])
        self.yielded = int(state["yielded"])


def _relabelled(batch, generator):
    """`batch` with each integer tensor in it (at any depth of mappings, tuples and lists) mapped
    through a random permutation of its values; marks that the mutant acted when there was one."""
    import torch

    if isinstance(batch, torch.Tensor):
        if batch.is_floating_point() or batch.is_complex() or batch.dtype == torch.bool or not batch.numel():
            return batch
        record_acted()
        low = int(batch.min())
        permutation = torch.randperm(int(batch.max()) - low + 1, generator=generator) + low
        return permutation[(batch - low).cpu()].to(batch.device, batch.dtype)
    if isinstance(batch, Mapping):
        items = {key: _relabelled(value, generator) for key, value in batch.items()}
        return type(batch)(items) if type(batch) is dict else items
    if isinstance(batch, (tuple, list)):
        items = [_relabelled(value, generator) for value in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch


def _built_optimizer(inner: str, params, kwargs: dict, **optional):
    """The optimizer factory at `inner` called as the protocol says: `named_parameters`, `model` and
    `implementation` only if it takes them; a non-default implementation it does not take is
    UnavailableImplementation, as torchmatrix.components.calling.build_optimizer has it."""
    factory = load(inner)
    implementation = optional.get("implementation") or DEFAULT_IMPLEMENTATION
    if implementation != DEFAULT_IMPLEMENTATION and not accepts(factory, "implementation"):
        raise UnavailableImplementation(implementation_not_named(factory, implementation))
    given = {name: value for name, value in optional.items() if value is not None and accepts(factory, name)}
    return factory(params, **kwargs, **given)


def _layers(model) -> list:
    """The model's `decoder_layers()`, or the model itself when it has none (a stack that checkpoints
    a function, not layer modules): every module with parameters inside it is then hooked."""
    return model.decoder_layers() if hasattr(model, "decoder_layers") else [model]


def _set_counter(cache, value: int) -> None:
    """The mutant's write counter on the cache: an item of a plain dict, an attribute of any other object."""
    if isinstance(cache, dict):
        cache["mutant_writes"] = value
    else:
        cache.mutant_writes = value


def _counter(cache) -> int:
    return cache["mutant_writes"] if isinstance(cache, dict) else cache.mutant_writes


def _in_backward() -> bool:
    """Whether autograd is running a backward pass now: a module that runs then is being recomputed."""
    import torch

    return torch._C._current_graph_task_id() != -1


def _note_if_recomputing() -> None:
    if _in_backward():
        record_acted()


def _hook_every_leaf(layer, hook, *, with_kwargs: bool = False) -> None:
    """`hook` as a forward pre-hook on every submodule of `layer` holding parameters of its own: the
    ones inside a checkpointed body run again when it is recomputed, wherever the checkpoint sits."""
    leaves = [m for m in layer.modules() if m is not layer and next(m.parameters(recurse=False), None) is not None]
    if not leaves:
        record_cannot_act(f"{type(layer).__name__} has no submodule with parameters of its own to hook")
    for module in leaves:
        module.register_forward_pre_hook(hook, with_kwargs=with_kwargs)
