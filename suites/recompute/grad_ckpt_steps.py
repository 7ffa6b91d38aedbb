"""One grad_ckpt step recorded: forward and backward without and with checkpointing on the same
batch, and everything each leaves behind that the tests compare (a `StepRecord`)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointError

from torchmatrix.testing import (
    current_device,
    data_parallel_rank,
    load,
    rng_streams,
    root_cause,
    user_model,
)

from ..comparison.deterministic import deterministic_algorithms
from ..components.forward_output import OUTPUT, model_output
from ..components.model_output import cache_on, call_model
from ..components.parallelize_component import parallelized
from ..components.training_step import build_training_step
from ..state.built_names import named_modules_as_built, named_parameters_as_built
from ..state.cache_tree import cache_contents, cache_marks, cache_snapshot, cache_writes
from ..state.full_tensors import full_gradients
from ..state.module_state_walk import body_call_counters, buffers, local_tensor, module_state
from ..state.reachable_state import kept_as_they_are, module_level_containers
from .checkpoint_units import CheckpointUnits, counted_checkpoints, watched_sites
from .compiled_rng import graph_safe_rng_applies, one_random_stream
from .grad_ckpt_precision import Precision

SEED = 0


def local_gradients(model) -> dict:
    return {n: local_tensor(p.grad).detach().clone() for n, p in named_parameters_as_built(model) if p.grad is not None}


def local_parameters(model) -> dict:
    return {n: local_tensor(p).detach().clone() for n, p in named_parameters_as_built(model)}


def cache_state(caches: dict) -> dict[str, object]:
    return cache_contents(caches)[1]


def found_caches(seen: dict, units: CheckpointUnits) -> tuple[dict, str]:
    """The caches of one step and where they were found: the ``past_key_values`` of the model's output
    (``seen``, suites/components/forward_output.py), else the containers forward handed to its checkpointed units
    and wrote tensors to after handing them (the cache hook: a mask or rotary table passed along
    unchanged is no cache); "unseen" where neither found one and no module call's output was seen."""
    returned = cache_on(seen.get(OUTPUT))
    if returned is not None and cache_contents({"past_key_values": returned})[0]:
        return {"past_key_values": returned}, "output"
    observed: dict[str, object] = {}
    for name, container, marks in units.containers:
        if cache_writes(marks, {name: container}):
            observed[name if name not in observed else f"{name}#{len(observed)}"] = container
    if observed:
        return observed, "hook"
    if OUTPUT not in seen:
        return {}, "unseen"
    return ({} if returned is None else {"past_key_values": returned}), "output"


@dataclass
class StepRecord:
    """Everything one forward+backward leaves behind that the tests compare."""

    loss: object
    parameters: dict
    local_grads: dict
    full_grads: dict
    calls_after_forward: dict
    calls_after_backward: dict
    calls_source: str
    unit_sites: list
    has_cache: bool
    cache_source: str
    precision: Precision
    cache_after_forward: dict
    cache_after_backward: dict
    cache_state_after_forward: dict
    cache_state_after_backward: dict
    cache_written_in_backward: list
    cache_writers: dict
    buffers: dict
    module_state_before_forward: dict
    module_state_after_backward: dict
    body_call_counters: set
    forward_drew_random_numbers: bool
    saved_bytes: int

    @property
    def layers_recomputed(self) -> list[str]:
        """The layers whose body ran again during backward."""
        return [
            layer
            for layer, count in self.calls_after_backward.items()
            if count > self.calls_after_forward.get(layer, count)
        ]


def compile_mode(cell) -> str | None:
    """The cell's compile mode as messages name it (``compile=inductor, nesting outside``), None for an eager cell."""
    backend = str(cell.get("compile", "none"))
    if backend == "none":
        return None
    return f"compile={backend}, nesting {cell.get('compile_nesting', 'outside')}"


class RecomputeMismatch(RuntimeError):
    """torch's CheckpointError in a compiled cell, with the checkpoint unit whose recompute raised it
    (torch's message names none)."""

    def __init__(self, origin: str, error: CheckpointError):
        super().__init__(f"in the recompute of {origin}: {error}")
        self.origin = origin


@contextmanager
def failing_stage(cell, what: str):
    """Re-raise an error of ``what`` naming the cell and torch version: a broken combination fails, never
    skips. In a compiled cell the message names the compile mode and leads with the compiler's root
    cause line, which a Dynamo or backend error otherwise buries under pages of traceback."""
    try:
        yield
    except Exception as error:
        mode = compile_mode(cell)
        if mode is None:
            raise RuntimeError(f"cell {cell.id}, torch {torch.__version__}: {what} failed: {error!r}") from error
        where = f" in the recompute of {error.origin}" if isinstance(error, RecomputeMismatch) else ""
        raise RuntimeError(
            f"cell {cell.id}, torch {torch.__version__}, {mode}: {what} failed{where}: {root_cause(error)}"
        ) from error


def longer_batch(batch):
    """``batch`` with every tensor of two or more dimensions repeated along dim 1, the sequence
    dimension of (batch, tokens, ...) layouts: the same step with a grown KV cache."""
    if isinstance(batch, torch.Tensor):
        return torch.cat((batch, batch), dim=1) if batch.dim() >= 2 else batch
    if isinstance(batch, Mapping):
        return {key: longer_batch(value) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(longer_batch(value) for value in batch)
    return batch


@contextmanager
def saved_activation_bytes():
    """Counts, under ``"bytes"``, what autograd saves for backward during the block outside checkpointed
    regions (checkpoint's own hooks take the saves inside them, and a compiled region saves only what
    its partitioner keeps): the evidence that checkpointing was applied where no Python reruns. Only
    compiled cells count: a tensor saved through hooks escapes autograd's check that it was not
    modified in place before backward, which eager cells keep."""
    counted = {"bytes": 0}

    def pack(tensor):
        counted["bytes"] += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield counted


def micro_batch_seed(rank: int, index: int) -> int:
    """The batch seed of this rank's ``index``-th micro-batch; the first is the single-batch step's."""
    return SEED + 1 + rank + 1000 * index


@contextmanager
def modules_run(model: nn.Module):
    """Holds, under ``"last"``, the name of the last module (of any model) whose forward began in the block."""
    names = {id(module): name for name, module in named_modules_as_built(model)}
    seen: dict[str, str] = {}

    def note(module, _args) -> None:
        seen["last"] = names.get(id(module), type(module).__name__)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(note)
    try:
        yield seen
    finally:
        handle.remove()


def layer_calls(model: nn.Module, units: CheckpointUnits) -> dict[str, int]:
    """Layer -> how often its body ran: ``model.body_calls()`` where the model has it, else the
    checkpoint units the suite's instrumented ``torch.utils.checkpoint`` counted."""
    if hasattr(user_model(model), "body_calls"):
        return user_model(model).body_calls()
    return units.calls(model)


def calls_source(model: nn.Module) -> str:
    """What counted the layer bodies, for the messages."""
    if hasattr(user_model(model), "body_calls"):
        return "body_calls()"
    return "the checkpoint units the suite's instrumented torch.utils.checkpoint saw"


def recompute_origin(layers_run: dict, seen: dict) -> str:
    """Where a recompute that torch found inconsistent ran: the layer (a ``body_calls()`` or checkpoint
    unit name) holding the last module that ran, or that module (inside a checkpointed function), or none ran."""
    module = seen.get("last")
    if module is None:
        return "a checkpointed function in which no module ran during backward"
    layers = [layer for layer in layers_run if module == layer or module.startswith(f"{layer}.")]
    if layers:
        return f"layer {max(layers, key=len)} (its module {module} ran last)"
    return f"the checkpointed function around module {module} (it ran last)"


@contextmanager
def static_lengths(static: bool):
    """Dynamo compiles each sequence length it meets as a graph of its own, instead of a graph with a
    dynamic length: once a block's code has met a second length (the test at another length, earlier
    in this process), automatic dynamic shapes would recompile it dynamically in every later test too.
    Keeps the other comparisons off that path, which fails upstream for tensor-parallel blocks
    (docs/explanation/compile.md) and which the test at another length takes on purpose."""
    if not static:
        yield
        return
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        yield


def train_step(
    cell,
    components: dict,
    precision: Precision,
    dropout: float,
    checkpointing: bool,
    micro_batches: int = 1,
    ignored: tuple[str, ...] = (),
    sites: list = (),
    *,
    another_length: bool = False,
) -> StepRecord:
    """Build, wrap, and run ``micro_batches`` forwards (their losses summed) then one backward on this
    rank; failures say which stage broke. ``sites``: the checkpointed run's units, whose arguments the
    run without checkpointing watches for the cache hook. ``another_length``: a forward at another
    sequence length runs between the forwards and the backward, so in a compiled cell the backward's
    recompute finds a dynamic-shape graph beside the one its forward ran (pytorch#166926); without it
    a compiled cell compiles every length statically."""
    build_model, make_batch = (load(components[name]) for name in ("model", "batch"))
    device = current_device()
    rank = data_parallel_rank(cell)
    mode = "with" if checkpointing else "without"
    compiled = compile_mode(cell) is not None
    torch.manual_seed(SEED)
    with counted_checkpoints() as units, static_lengths(compiled and not another_length):
        with failing_stage(cell, f"building the model ({components['model']})"):
            model = build_model(cell, dropout=dropout, dtype=getattr(torch, precision.dtype))
            batches = [
                make_batch(model, seed=micro_batch_seed(rank, index), device=device) for index in range(micro_batches)
            ]
            declared = getattr(model, "compute_dtype", None)
            precision = precision.computing(None if declared is None else str(declared).removeprefix("torch."))
            precision = precision.compiled_by(cell.get("compile") if compiled else None)
            precision = replace(precision, graph_safe_rng_off=graph_safe_rng_applies(device, compiled))
        with failing_stage(
            cell, f"parallelize (fsdp={cell['fsdp']}, mesh={cell.get('mesh', 'flat')}) {mode} activation checkpointing"
        ):
            model = parallelized(components, model, cell, device=device, activation_checkpointing=checkpointing)
        model.train()
        step = build_training_step(components, model=model, optimizer=None, cell=cell)
        parameters = local_parameters(model)
        module_state_before, _ = module_state(model, ignored)
        put_module_containers_back = kept_as_they_are(module_level_containers(model, ignored))
        torch.manual_seed(SEED + 1000 + rank)
        rng_before_forward = rng_streams()
        losses = []
        with (
            failing_stage(cell, f"forward {mode} activation checkpointing"),
            model_output(model) as seen,
            watched_sites(model, sites, units),
            saved_activation_bytes() if compiled else nullcontext({"bytes": 0}) as saved,
        ):
            for batch in batches:
                units.next_forward()
                losses.append(step.loss(batch))
        loss = losses[0] if len(losses) == 1 else torch.stack(losses).sum()
        forward_drew_random_numbers = rng_streams() != rng_before_forward
        caches, cache_source = found_caches(seen, units)
        cache_after_forward = cache_snapshot(caches)
        cache_state_after_forward = cache_state(caches)
        marks_after_forward = cache_marks(caches)
        if another_length:
            with failing_stage(
                cell,
                f"a forward at another sequence length (batch tensors repeated along dim 1) {mode} activation checkpointing",
            ):
                units.next_forward()
                call_model(model, longer_batch(batches[0]))
        calls_after_forward = layer_calls(model, units)
        with (
            failing_stage(
                cell, f"backward {mode} activation checkpointing (did a recomputed layer differ from its forward?)"
            ),
            nullcontext({}) if compiled else modules_run(model) as ran,
        ):
            try:
                step.backward(loss)
            except CheckpointError as error:
                if compiled:
                    origin = units.rerunning(model) or "a checkpointed function (no unit ran again)"
                    raise RecomputeMismatch(origin, error) from error
                origin = recompute_origin(layer_calls(model, units), ran)
                raise RuntimeError(f"in the recompute of {origin}: {error}") from error
        calls_after_backward = layer_calls(model, units)
        unit_sites = units.sites(model)
        cache_writers = units.rerun_writers(model, cache_contents(caches)[0])
    module_state_after, ints_after = module_state(model, ignored)
    put_module_containers_back()
    return StepRecord(
        loss=loss.detach().float().cpu(),
        parameters=parameters,
        local_grads=local_gradients(model),
        full_grads=full_gradients(model),
        calls_after_forward=calls_after_forward,
        calls_after_backward=calls_after_backward,
        calls_source=calls_source(model),
        unit_sites=unit_sites,
        has_cache=bool(caches),
        cache_source=cache_source,
        precision=precision,
        cache_after_forward=cache_after_forward,
        cache_after_backward=cache_snapshot(caches),
        cache_state_after_forward=cache_state_after_forward,
        cache_state_after_backward=cache_state(caches),
        cache_written_in_backward=cache_writes(marks_after_forward, caches),
        cache_writers=cache_writers,
        buffers=buffers(model),
        module_state_before_forward=module_state_before,
        module_state_after_backward=module_state_after,
        body_call_counters=body_call_counters(model, ints_after) if hasattr(user_model(model), "body_calls") else set(),
        forward_drew_random_numbers=forward_drew_random_numbers,
        saved_bytes=saved["bytes"],
    )


def shards_only(local: dict, full: dict) -> dict:
    """The local gradients that are real shards; an unsharded one is already checked as a full tensor."""
    return {name: grad for name, grad in local.items() if name not in full or grad.shape != full[name].shape}


# This rank's last pair of steps on a CPU, (its arguments, the pair or the error it raised): the
# dropout gradient test, the recompute test and the module-state tests of a cell ask for the same pair.
_last_steps: list[tuple[tuple, object]] = []


def both_steps(
    cell,
    components: dict,
    precision: Precision,
    dropout: float,
    micro_batches: int = 1,
    ignored: tuple[str, ...] = (),
    *,
    another_length: bool = False,
) -> tuple[StepRecord, StepRecord]:
    """The step without and the step with activation checkpointing (or the error they raised), run
    once on a CPU for the tests of a cell that ask for the same pair: the steps are deterministic, so
    a rerun would only repeat them. On an accelerator each test runs its own pair: a remembered pair
    would hold its model's parameters and gradients in the device's memory under the next suites."""
    if current_device().type != "cpu":
        return run_both_steps(cell, components, precision, dropout, micro_batches, tuple(ignored), another_length)
    key = (cell.id, sorted(components.items()), precision, dropout, micro_batches, tuple(ignored), another_length)
    if not _last_steps or _last_steps[0][0] != key:
        try:
            outcome = run_both_steps(
                cell, components, precision, dropout, micro_batches, tuple(ignored), another_length
            )
        except Exception as error:
            outcome = error
        _last_steps[:] = [(key, outcome)]
    outcome = _last_steps[0][1]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def run_both_steps(
    cell,
    components: dict,
    precision: Precision,
    dropout: float,
    micro_batches: int,
    ignored: tuple[str, ...],
    another_length: bool = False,
) -> tuple[StepRecord, StepRecord]:
    """The step without and the step with activation checkpointing, under deterministic kernels and
    one random stream; the checkpointed one runs first, so the other can watch its units' arguments
    for the cache hook."""
    with deterministic_algorithms(), one_random_stream(current_device(), compile_mode(cell) is not None):
        with_ckpt = train_step(
            cell, components, precision, dropout, True, micro_batches, ignored, another_length=another_length
        )
        without_ckpt = train_step(
            cell,
            components,
            precision,
            dropout,
            False,
            micro_batches,
            ignored,
            with_ckpt.unit_sites,
            another_length=another_length,
        )
    return without_ckpt, with_ckpt
