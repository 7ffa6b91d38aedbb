"""Activation checkpointing must not change gradients, even when layers mutate a KV cache.

- Per cell the ``model`` component is built twice from one seed, without and with per-layer
  checkpointing, wrapped by ``parallelize`` for the cell (its DeviceMesh where the signature names
  ``mesh``), and run forward+backward on the same per-rank ``batch`` (the ranks of a tensor-parallel
  group share one).
- Losses and gradients (local shards and full tensors) match bit for bit in float32 (``grad_max_ulp``
  recorded) or within the derived bf16 tolerance (``BF16_RTOL``), also when K micro-batches run
  forward before one backward; buffers and each module's own attribute state match exactly.
- Recompute must really run (no layer body ran again: checkpointing not applied, a failure) and
  leave the cache, its tensors and its non-tensor state as forward left it; a cell where no cache
  tensor was written during backward fails (its cache checks saw nothing). A ``CheckpointError``
  names its layer.
- What the stack lacks skips with its reason: no cache (None or empty in both runs), no dropout
  (the dropout variant, where forward draws no random number).
- Why: a per-tensor gradient difference with mean ~0 hides in loss curves (pi05's grad-ckpt + KV
  cache report), and a counter recompute bumps twice changes no gradient of this step, only later ones.
- Compiled cells (``compile``, ``compile_nesting``; docs/explanation/compile.md): aot_eager stays bit
  for bit, a kernel-generating backend is compared within ``REORDER_RTOL``; a test of its own runs a
  forward at another sequence length before backward (pytorch#166926), so an expected failure there
  leaves the other comparisons running; checkpointing is shown applied by autograd saving less for
  backward; a compiler error fails with the compile mode and its root cause. Each compiled cell's
  steps are also compared with their eager twin (suites/eager_twin.py): the same components stepped
  under ``force_eager``, bit for bit under aot_eager, within ``STEP_RTOL`` per step under a
  kernel-generating backend, naming the first tensor that differs.
- The loss and the backward are the stack's `training_step` component's (`loss`, `backward`;
  suites/training_step.py), built with `optimizer=None`: grad_ckpt takes no optimizer step.
- Model contract (beyond torchmatrix/components/protocol.py): without a `training_step` the loss is read as
  suites/model_output.py says; the cache from the output's ``past_key_values`` or through the
  containers forward hands its checkpointed units (suites/checkpoint_units.py); recompute is counted
  by ``model.body_calls()`` or the suite's instrumented ``torch.utils.checkpoint.checkpoint``; a model
  computing in another dtype declares ``compute_dtype`` (or option ``compute_dtype``).
- Options: ``GradCkptOptions`` (torchmatrix/matrix/suite_options.py).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import CheckpointError

from torchmatrix.testing import (
    DTYPES,
    GradCkptOptions,
    current_device,
    data_parallel_rank,
    load,
    rng_streams,
    root_cause,
    user_model,
    wrapper_chain,
)

from .built_names import named_buffers_as_built, named_modules_as_built, named_parameters_as_built
from .cache_tree import CACHE_STATE_DEPTH, OPAQUE, cache_contents, cache_marks, cache_snapshot, cache_writes
from .checkpoint_units import CheckpointUnits, counted_checkpoints, watched_sites
from .compiled_rng import GRAPH_SAFE_RNG_OFF, graph_safe_rng_applies, one_random_stream
from .deterministic import deterministic_algorithms
from .eager_twin import (
    KERNEL_KEEPING_BACKENDS,
    TWIN_STEPS,
    compare_with_eager_twin,
    first_difference,
    step_lines,
    twin_bound,
)
from .forward_output import OUTPUT, model_output
from .full_tensors import full_gradients
from .model_output import cache_on, call_model
from .optimizer_state import plain_equal
from .parallelize_component import parallelized
from .reachable_state import is_user_object, kept_as_they_are, module_level_containers
from .training_step import build_training_step
from .ulp import bits_equal, differing_bits, ulp_distance

OPTIONS = GradCkptOptions  # the dataclass `suite_options` arrives as

SEED = 0
DROPOUT = 0.1
BODY_CALLS_PROBE = 1_000_003


# bfloat16 keeps 8 significant bits, eps = 2**-7. The suite's bf16 models accumulate matmuls
# and reductions in fp32 (as CPU and GPU bf16 kernels do), so a recompute that sums in another
# order differs there by ~K * 2**-24, far below bf16's resolution; what remains is each side's
# rounding to bf16, at most one ulp each, so the two may sit two ulps apart: rtol = 2 * eps.
# Where a gradient element cancelled to near zero a relative bound means nothing, so the
# absolute floor is the same two ulps at the tensor's own scale: atol = 2 * eps * max|expected|.
BF16_RTOL = 2 * 2**-7

# Under a compiler that generates its own kernels (inductor, or a backend of the user's), the two
# compiled steps may not run the same float32 kernels: the partitioner may fuse the recomputed
# forward ops into the backward's kernels, so a reduction of K terms may be summed in another order.
# Reordering K float32 terms moves the sum by at most (K - 1) * 2**-24 of the sum of their magnitudes;
# this bound allows K = 1024 (the reference decoder's longest reduction is 64 terms): rtol = 2**-14,
# with the absolute floor at the tensor's own scale as for bf16, since a cancelled element has no
# meaningful relative error. aot_eager (and eager) run torch's own kernels on the same inputs in
# both steps, so they stay bit for bit.
REORDER_RTOL = 2**10 * 2**-24


@dataclass(frozen=True)
class Precision:
    """The dtype the models run in and how close checkpointed gradients must be to the reference;
    ``compiler``: the compile backend, where it generates kernels of its own."""

    dtype: str
    compute: str | None = None
    compiler: str | None = None
    graph_safe_rng_off: bool = False

    @property
    def bf16(self) -> bool:
        return (self.compute or self.dtype) == "bfloat16"

    @property
    def exact(self) -> bool:
        return not self.bf16 and self.compiler is None

    @property
    def rtol(self) -> float:
        """The relative tolerance, which is also the absolute floor's fraction of max|expected|."""
        return BF16_RTOL if self.bf16 else REORDER_RTOL

    def computing(self, declared: str | None) -> Precision:
        """This precision with the model's declared compute dtype, unless option ``compute_dtype`` set one."""
        if self.compute or declared in (None, self.dtype):
            return self
        if declared not in DTYPES:
            raise ValueError(
                f"the model declares compute_dtype = torch.{declared}: expected torch.float32 or torch.bfloat16"
            )
        return replace(self, compute=declared)

    def compiled_by(self, backend: str | None) -> Precision:
        """This precision for steps compiled by ``backend`` (None: eager)."""
        return replace(self, compiler=None if backend in (None, *KERNEL_KEEPING_BACKENDS) else backend)

    def describe(self) -> str:
        return self.tolerance() + (f", {GRAPH_SAFE_RNG_OFF}" if self.graph_safe_rng_off else "")

    def tolerance(self) -> str:
        label = self.dtype if self.compute in (None, self.dtype) else f"{self.dtype} params, {self.compute} compute"
        if self.exact:
            return f"{label}, bit for bit"
        if self.bf16:
            return f"{label}, rtol={BF16_RTOL} and atol={BF16_RTOL} x max|expected| per tensor (two bf16 ulps)"
        return (
            f"{label} compiled by {self.compiler}, rtol={REORDER_RTOL} and atol={REORDER_RTOL} x max|expected| "
            f"per tensor (float32 reductions of up to 1024 terms summed in another order)"
        )


EXACT = Precision("float32")


def precision_from(options: GradCkptOptions) -> Precision:
    """float32 is compared bit for bit; bfloat16 within the derived two-ulp tolerance."""
    return Precision(options.dtype, options.compute_dtype)


def local_tensor(tensor):
    """This rank's shard of a DTensor (FSDP2), or the tensor itself (FSDP1 flat-param views, no FSDP)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def local_gradients(model) -> dict:
    return {n: local_tensor(p.grad).detach().clone() for n, p in named_parameters_as_built(model) if p.grad is not None}


def local_parameters(model) -> dict:
    return {n: local_tensor(p).detach().clone() for n, p in named_parameters_as_built(model)}


def cache_state(caches: dict) -> dict[str, object]:
    return cache_contents(caches)[1]


def found_caches(seen: dict, units: CheckpointUnits) -> tuple[dict, str]:
    """The caches of one step and where they were found: the ``past_key_values`` of the model's output
    (``seen``, suites/forward_output.py), else the containers forward handed to its checkpointed units
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


def compare_values(what: str, actual: dict, expected: dict) -> list[str]:
    """One line per path whose plain values differ or that only one side has (actual first, expected second)."""
    problems = [f"{what} {path}: missing from the second" for path in actual.keys() - expected.keys()]
    problems += [f"{what} {path}: missing from the first" for path in expected.keys() - actual.keys()]
    problems += [
        f"{what} {path}: {actual[path]!r} vs {expected[path]!r}"
        for path in actual.keys() & expected.keys()
        if actual[path] != expected[path]
    ]
    return sorted(problems)


def buffers(model) -> dict:
    """Every buffer by the model's own name, copied to the CPU (FSDP leaves buffers whole on every rank)."""
    return {n: local_tensor(b).detach().to("cpu", copy=True) for n, b in named_buffers_as_built(model)}


MODULE_INTERNALS = frozenset(vars(nn.Module()))
# What FSDP and torch's composable APIs keep on the modules they wrap: the same in both runs, not the model's.
WRAPPER_ATTRIBUTES = ("__", "_fsdp", "_is_fsdp")
PLAIN_VALUES = (int, float, bool, str, type(None))


@dataclass(frozen=True)
class Entries:
    """A container in a module's state, by its length (its items are compared under their own paths)."""

    count: int

    def __repr__(self) -> str:
        return f"{self.count} entries"


@dataclass(frozen=True)
class Slot:
    """Where a value of a module's state is held: an attribute of an object, or an item of a container."""

    holder: object
    key: object
    attribute: bool

    def get(self):
        return getattr(self.holder, self.key) if self.attribute else self.holder[self.key]

    def set(self, value) -> None:
        if self.attribute:
            object.__setattr__(self.holder, self.key, value)
        else:
            self.holder[self.key] = value


MAX_ITEMS_WALKED = 1000
"""Items of one container the module-state walk enters (its length is compared whatever it is)."""
MAX_STATE_VALUES = 50_000
"""Values the module-state walk records in all: a bound on what one snapshot copies."""


def module_state(model: nn.Module, ignored: tuple[str, ...] = ()) -> tuple[dict[str, object], dict[str, Slot]]:
    """Every module's own attributes that hold tensors, numbers, strings, containers of them or
    objects of the user's classes (a dataclass of routing statistics), by path
    (``prefix_layers.1.aux_losses[0]``, ``prefix_layers.1.stats.tokens``), and the module-level
    containers of the Python modules that define the model's classes
    (``models.moe.AUX_LOSS_TRACKER['layer 1']``, suites/reachable_state.py): state a forward may
    append to or bump outside buffers and parameters; and where each int is held, so
    ``body_call_counters`` can find the counters ``body_calls()`` reports. torch's own module
    internals, parameters, submodules, wrapper modules and the names in ``ignored`` are left out;
    an object reached twice is walked once, and the walk is bounded in depth and size."""
    state: dict[str, object] = {}
    ints: dict[str, Slot] = {}
    walked: set[int] = set()

    def walk(value, path: str, depth: int, slot: Slot) -> None:
        if isinstance(value, nn.Parameter) or isinstance(value, OPAQUE) or depth > CACHE_STATE_DEPTH:
            return
        if len(state) >= MAX_STATE_VALUES:
            return
        if not isinstance(value, (*PLAIN_VALUES, torch.Tensor)):
            if id(value) in walked:
                return
            walked.add(id(value))
        if isinstance(value, PLAIN_VALUES):
            state[path] = value
            if type(value) is int:
                ints[path] = slot
        elif isinstance(value, torch.Tensor):
            state[path] = local_tensor(value).detach().to("cpu", copy=True)
        elif isinstance(value, (list, tuple, set, frozenset)):
            state[path] = Entries(len(value))
            items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
            for index, item in enumerate(items[:MAX_ITEMS_WALKED]):
                walk(item, f"{path}[{index}]", depth + 1, Slot(value, index, False))
        elif isinstance(value, dict):
            state[path] = Entries(len(value))
            for key, item in list(value.items())[:MAX_ITEMS_WALKED]:
                walk(item, f"{path}[{key!r}]", depth + 1, Slot(value, key, False))
        elif is_user_object(value):
            for attribute, item in vars(value).items():
                if not attribute.startswith("__") and attribute not in ignored:
                    walk(item, f"{path}.{attribute}", depth + 1, Slot(value, attribute, True))

    wrappers = {id(wrapper) for wrapper in wrapper_chain(model)[:-1]}
    for name, module in named_modules_as_built(model):
        if id(module) in wrappers or isinstance(module, FullyShardedDataParallel):
            continue
        for attribute, value in vars(module).items():
            if attribute in MODULE_INTERNALS or attribute in ignored or attribute.startswith(WRAPPER_ATTRIBUTES):
                continue
            if attribute in module._parameters or attribute in module._modules:
                continue
            path = f"{name}.{attribute}" if name else attribute
            walk(value, path, 0, Slot(module, attribute, True))
    for path, container in module_level_containers(model, ignored).items():
        walk(container, path, 0, Slot(sys.modules[path.rpartition(".")[0]], path.rpartition(".")[2], True))
    return state, ints


def body_call_counters(model: nn.Module, ints: dict[str, Slot]) -> set[str]:
    """The ints that ``body_calls()`` reports, found by moving each one and seeing whether what it
    returns moves: recompute must bump those (and only those), so the attribute check leaves them out."""
    reported = user_model(model).body_calls()
    found = set()
    for path, slot in ints.items():
        try:
            value = slot.get()
            slot.set(value + BODY_CALLS_PROBE)
        except (TypeError, IndexError, KeyError, AttributeError):
            continue
        try:
            if user_model(model).body_calls() != reported:
                found.add(path)
        finally:
            slot.set(value)
    return found


def module_state_problems(
    actual: dict, expected: dict, before: tuple[dict, dict], counters: set[str] = frozenset()
) -> list[str]:
    """One line per attribute path whose value differs between the two runs after backward, or that
    only one has. Left out: paths the two runs already held differently before forward (set up
    differently, e.g. the layers' checkpointing switch), and the ``body_calls()`` counters
    (``counters``), which recompute must bump."""
    set_up_differently = {
        path
        for path in before[0].keys() | before[1].keys()
        if not plain_equal(before[0].get(path), before[1].get(path))
    }
    problems = []
    for path in sorted((actual.keys() | expected.keys()) - set_up_differently - counters):
        if path not in expected:
            problems.append(f"{path}: present with checkpointing only ({actual[path]!r})")
        elif path not in actual:
            problems.append(f"{path}: present without checkpointing only ({expected[path]!r})")
        elif not plain_equal(actual[path], expected[path]):
            problems.append(f"{path}: {describe_difference(actual[path], expected[path])}")
    return problems


def describe_difference(actual, expected) -> str:
    if isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor):
        return mismatch(actual, expected, EXACT)
    if isinstance(actual, Entries) and isinstance(expected, Entries):
        return f"{actual.count} entries vs {expected.count}"
    return f"{actual!r} vs {expected!r}"


def drift(actual, expected) -> tuple[float, float]:
    """Max absolute and max relative difference (0/0 counts as 0, x/0 as inf), in float64."""
    if actual.numel() == 0:
        return 0.0, 0.0
    actual, expected = actual.double(), expected.double()
    abs_diff = (actual - expected).abs()
    rel_diff = torch.where(abs_diff == 0, torch.zeros_like(abs_diff), abs_diff / expected.abs())
    return abs_diff.max().item(), rel_diff.max().item()


def mismatch(actual, expected, precision: Precision) -> str | None:
    """None when the tensors agree under ``precision`` (bit for bit when exact), else why not."""
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} vs {expected.dtype}"
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)} vs {tuple(expected.shape)}"
    if precision.exact:
        if bits_equal(actual, expected):
            return None
    else:
        try:
            atol = precision.rtol * expected.detach().abs().max().item() if expected.numel() else 0.0
            torch.testing.assert_close(actual, expected, rtol=precision.rtol, atol=atol)
            return None
        except AssertionError:
            pass
    differing = differing_bits(actual, expected)
    if not actual.is_floating_point():
        return (
            f"{actual.item()} vs {expected.item()}" if actual.numel() == 1 else f"{differing}/{actual.numel()} differ"
        )
    max_abs, max_rel = drift(actual, expected)
    return f"{differing}/{actual.numel()} elements differ, max {ulp_distance(actual, expected)} ULP, max abs diff {max_abs:.3e}, max rel diff {max_rel:.3e}"


def compare_tensors(what: str, actual: dict, expected: dict, precision: Precision) -> list[str]:
    """One line per name whose tensors differ or that only one side has (actual first, expected second)."""
    problems = [f"{what} {name}: missing from the second" for name in actual.keys() - expected.keys()]
    problems += [f"{what} {name}: missing from the first" for name in expected.keys() - actual.keys()]
    for name in actual.keys() & expected.keys():
        reason = mismatch(actual[name], expected[name], precision)
        if reason:
            problems.append(f"{what} {name}: {reason}")
    return sorted(problems)


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


def compare_gradients(
    cell, components: dict, precision: Precision, dropout: float, micro_batches: int = 1, another_length: bool = False
) -> dict:
    """Rank function: one step without and one with checkpointing (``micro_batches`` forwards before
    its backward, and a forward at another sequence length before it where ``another_length``); the
    differences, as plain data."""
    without_ckpt, with_ckpt = both_steps(
        cell, components, precision, dropout, micro_batches, another_length=another_length
    )
    precision = with_ckpt.precision
    return {
        "precision": precision,
        "counted_by": with_ckpt.calls_source,
        "compared": len(with_ckpt.full_grads.keys() & without_ckpt.full_grads.keys()),
        "recomputed": with_ckpt.layers_recomputed,
        "saved_bytes": (without_ckpt.saved_bytes, with_ckpt.saved_bytes),
        "drew_random_numbers": without_ckpt.forward_drew_random_numbers,
        "init": compare_tensors("parameter", with_ckpt.parameters, without_ckpt.parameters, EXACT),
        "loss": (
            without_ckpt.loss.item(),
            with_ckpt.loss.item(),
            mismatch(with_ckpt.loss, without_ckpt.loss, precision),
        ),
        "local": compare_tensors(
            "local gradient shard of",
            shards_only(with_ckpt.local_grads, with_ckpt.full_grads),
            shards_only(without_ckpt.local_grads, with_ckpt.full_grads),
            precision,
        ),
        "full": compare_tensors("full gradient of", with_ckpt.full_grads, without_ckpt.full_grads, precision),
        "drift": {
            name: drift(with_ckpt.full_grads[name], without_ckpt.full_grads[name])
            for name in with_ckpt.full_grads.keys() & without_ckpt.full_grads.keys()
            if with_ckpt.full_grads[name].shape == without_ckpt.full_grads[name].shape
        },
        "ulp": max(
            (
                ulp_distance(with_ckpt.full_grads[name], without_ckpt.full_grads[name])
                for name in with_ckpt.full_grads.keys() & without_ckpt.full_grads.keys()
                if with_ckpt.full_grads[name].shape == without_ckpt.full_grads[name].shape
                and with_ckpt.full_grads[name].dtype == without_ckpt.full_grads[name].dtype
            ),
            default=0,
        ),
    }


def inspect_recompute(cell, components: dict, precision: Precision, dropout: float) -> dict:
    """Rank function: layer body counts and cache entries around backward, with and without checkpointing."""
    without_ckpt, with_ckpt = both_steps(cell, components, precision, dropout)
    precision = with_ckpt.precision
    # A hook-found cache handed only to plain functions has no eager twin: watched_sites cannot reach them.
    eager = without_ckpt.has_cache or with_ckpt.cache_source == "output"
    return {
        "precision": precision,
        "counted_by": with_ckpt.calls_source,
        "saved_bytes": (without_ckpt.saved_bytes, with_ckpt.saved_bytes),
        "cache_source": with_ckpt.cache_source,
        "calls": {
            "without": (without_ckpt.calls_after_forward, without_ckpt.calls_after_backward),
            "with": (with_ckpt.calls_after_forward, with_ckpt.calls_after_backward),
        },
        "cache_backward": compare_tensors(
            "cache entry", with_ckpt.cache_after_backward, with_ckpt.cache_after_forward, precision
        ),
        "cache_forward": compare_tensors(
            "cache entry", with_ckpt.cache_after_forward, without_ckpt.cache_after_forward, precision
        )
        if eager
        else [],
        "has_cache": (without_ckpt.has_cache, with_ckpt.has_cache),
        "cache_entries": (
            len(without_ckpt.cache_after_forward) if eager else len(with_ckpt.cache_after_forward),
            len(with_ckpt.cache_after_forward),
        ),
        "recompute_writes": with_ckpt.cache_written_in_backward,
        "cache_paths": (sorted(with_ckpt.cache_after_forward), sorted(with_ckpt.cache_after_backward)),
        "cache_writers": with_ckpt.cache_writers,
        "compiled": compile_mode(cell),
        "state_backward": compare_values(
            "cache state", with_ckpt.cache_state_after_backward, with_ckpt.cache_state_after_forward
        ),
        "state_vs_eager": compare_values(
            "cache state", with_ckpt.cache_state_after_backward, without_ckpt.cache_state_after_backward
        )
        if eager
        else [],
    }


def compare_module_state(
    cell, components: dict, precision: Precision, dropout: float, ignored: tuple[str, ...]
) -> dict:
    """Rank function: every buffer and every module's own attribute state after one forward+backward,
    with vs without checkpointing, exactly; the ``body_calls()`` counters left out."""
    without_ckpt, with_ckpt = both_steps(cell, components, precision, dropout, 1, ignored)
    return {
        "names": sorted(without_ckpt.buffers),
        "problems": compare_tensors("buffer", with_ckpt.buffers, without_ckpt.buffers, EXACT),
        "attributes": len(without_ckpt.module_state_after_backward),
        "attribute_problems": module_state_problems(
            with_ckpt.module_state_after_backward,
            without_ckpt.module_state_after_backward,
            (with_ckpt.module_state_before_forward, without_ckpt.module_state_before_forward),
            with_ckpt.body_call_counters | without_ckpt.body_call_counters,
        ),
        "counters": sorted(with_ckpt.body_call_counters | without_ckpt.body_call_counters),
    }


def compiled_checkpointing_shown(cell, result: dict) -> bool:
    """In a compiled cell, where recompute runs inside the compiled backward (compile outside) or stops
    before the compiled body's Python side effects replay (compile inside), so no counter sees a
    layer run again: checkpointing left less saved for backward than the run without it did."""
    without_ckpt, with_ckpt = result["saved_bytes"]
    return compile_mode(cell) is not None and with_ckpt < without_ckpt


def saved_bytes_line(result: dict) -> str:
    without_ckpt, with_ckpt = result["saved_bytes"]
    return f"autograd saved {with_ckpt} bytes for backward with checkpointing and {without_ckpt} without"


def not_applied_when_compiled(result: dict) -> str:
    """Why a compiled step shows no recompute, and what to change: autograd saving as much with
    checkpointing as without means it was never applied; saving more means it was applied, with a
    selective-checkpoint policy that saves every op (so nothing is left to recompute)."""
    without_ckpt, with_ckpt = result["saved_bytes"]
    if with_ckpt > without_ckpt:
        return (
            f"checkpointing was applied but recomputes nothing: {saved_bytes_line(result)}, more with it than "
            f"without, so its selective-checkpoint policy saves every op (CheckpointPolicy.MUST_SAVE or PREFER_SAVE "
            f"for all of them) and this compared the compiled step with itself; make the policy recompute "
            f"(PREFER_RECOMPUTE) at least the ops whose outputs it need not keep"
        )
    return (
        f"checkpointing was not applied: no layer body ran again in backward and {saved_bytes_line(result)}, so "
        f"this compared the compiled step with itself; `parallelize(..., activation_checkpointing=True)` must "
        f"checkpoint the decoder layers before compiling them"
    )


def require_gradients_and_recompute(cell, results: list[dict]) -> None:
    """Fail when some rank has no gradient to compare, or no layer body ran again in its backward
    with checkpointing (in a compiled cell: checkpointing saved no activations): either way the
    comparison would prove nothing."""
    assert all(r["compared"] for r in results), (
        f"cell {cell.id}: no parameter has a gradient on some rank, so there is nothing to compare; "
        f"gradients compared per rank: {[r['compared'] for r in results]}"
    )
    if compile_mode(cell) is not None:
        not_applied = [
            rank for rank, r in enumerate(results) if not (r["recomputed"] or compiled_checkpointing_shown(cell, r))
        ]
        if not_applied:
            raise AssertionError(
                f"cell {cell.id} ({compile_mode(cell)}): ranks {not_applied}: "
                + not_applied_when_compiled(results[not_applied[0]])
            )
        return
    not_recomputed = [rank for rank, r in enumerate(results) if not r["recomputed"]]
    if not_recomputed:
        raise AssertionError(
            f"cell {cell.id}: ranks {not_recomputed}: no layer body ran again in backward with activation checkpointing "
            f"(counted by {results[0]['counted_by']}: none ran again in backward), so checkpointing was not applied "
            f"and this compared eager with eager; `parallelize(..., activation_checkpointing=True)` must checkpoint the "
            f"decoder layers"
        )


def gradient_problems(results: list[dict], loss_name: str) -> dict[str, list[str]]:
    """Per rank, the loss and local-shard differences; under "every rank", the full-gradient ones."""
    problems = {}
    for rank, result in enumerate(results):
        without_ckpt, with_ckpt, loss_reason = result["loss"]
        found = [f"{loss_name} {with_ckpt!r} vs {without_ckpt!r}: {loss_reason}"] if loss_reason else []
        if found + result["local"]:
            problems[f"rank {rank}"] = found + result["local"]
    if results[0]["full"]:
        problems["every rank"] = results[0]["full"]
    return problems


def failure_text(cell, precision: Precision, headline: str, problems: dict[str, list[str]], hint: str = "") -> str:
    """The failure message: cell, dtype and tolerance and the conclusion in plain words, then the
    evidence (one line per tensor or value), then the usual fix where there is one."""
    mode = compile_mode(cell)
    lines = [f"cell {cell.id} ({precision.describe()}{', ' + mode if mode else ''}): {headline}"]
    for where, found in problems.items():
        lines += [f"  {where}: {problem}" for problem in found]
    if hint:
        lines.append(f"  usual fix: {hint}")
    return "\n".join(lines)


GRADIENTS_HINT = (
    "a recomputed layer must see what its forward saw: its own cache entry by layer index (not the latest one, "
    "which a later layer wrote), the same random numbers (checkpoint with preserve_rng_state=True), no state a "
    "later call changed"
)
REWRITE_HINT = (
    "a checkpointed layer must leave the cache as one run of it does: assign its own entry "
    "(cache[i] = (keys, values)) instead of appending to it, or write the cache outside the checkpointed unit"
)
NOT_RERUN_HINT = "checkpoint those layers: `parallelize(..., activation_checkpointing=True)` must wrap each in torch.utils.checkpoint"
PRESENCE_HINT = (
    "hand the cache to checkpointed layers as to plain ones; where a framework drops it under checkpointing "
    "(transformers gives a checkpointed layer that writes the cache cache=None), do not checkpoint the layers that write it "
    "or keep the cache out of training"
)
STATE_HINT = (
    "derive a count or length from the entries themselves (len(cache[i])) instead of bumping it on every run, "
    "or keep it outside the checkpointed unit"
)
ENTRIES_SHOWN = 6


def entry_list(paths: list[str]) -> str:
    """Cache paths as a reader scans them: the first in full, the rest after their shared root
    (``past_key_values[0][2], [0][3]``), at most ENTRIES_SHOWN."""
    roots = {path.partition("[")[0] for path in paths}
    shown = [paths[0]] + [path[len(next(iter(roots))) :] if len(roots) == 1 else path for path in paths[1:]]
    more = len(shown) - ENTRIES_SHOWN
    return ", ".join(shown[:ENTRIES_SHOWN]) + (f" and {more} more" if more > 0 else "")


def by_units(paths: list[str], writers: dict[str, str]) -> str:
    """`` (unit layers.0)``: the checkpoint units whose recompute wrote those paths, where known."""
    units = list(dict.fromkeys(writers[path] for path in paths if path in writers))
    return f" ({'unit' if len(units) == 1 else 'units'} {', '.join(units)})" if units else ""


def recompute_conclusion(result: dict, found: list[str]) -> tuple[str, str]:
    """What the recompute checks of one rank found, in plain words, and the usual fix ("" if none
    is usual): the cache growing or shrinking in backward first, then layers that did not rerun,
    entries rewritten with other values, the cache's own state, then the first problem line."""
    if lost_or_invented := cache_presence_problems(*result["cache_entries"]):
        return lost_or_invented[0], PRESENCE_HINT
    forward, backward = result["cache_paths"]
    writers = result["cache_writers"]
    added = [path for path in backward if path not in set(forward)]
    removed = [path for path in forward if path not in set(backward)]
    if added or removed:
        done = (
            f"recompute wrote {entry_list(added)} again{by_units(added, writers)}"
            if added
            else f"recompute removed {entry_list(removed)}"
        )
        return (
            f"after backward the cache has {len(backward)} entries, forward left {len(forward)}: {done}",
            REWRITE_HINT,
        )
    forward_calls, backward_calls = result["calls"]["with"]
    not_rerun = [layer for layer in forward_calls if backward_calls[layer] <= forward_calls[layer]]
    if not_rerun and result["compiled"] is None:
        return f"backward did not rerun {', '.join(not_rerun)}: checkpointing was not applied to them", NOT_RERUN_HINT
    if result["cache_backward"]:
        rewritten = [path for path in result["recompute_writes"] if path in writers] or result["recompute_writes"]
        where = f": {entry_list(rewritten)}{by_units(rewritten, writers)}" if rewritten else ""
        return (
            f"recompute rewrote {len(result['cache_backward'])} cache entries with values forward did not leave{where}",
            REWRITE_HINT,
        )
    if result["cache_forward"]:
        return (
            f"with checkpointing, forward left {len(result['cache_forward'])} cache entries different from forward "
            "without it",
            "",
        )
    if result["state_backward"]:
        return "recompute changed the cache's own state (a counter or length) that forward left", STATE_HINT
    return found[0], ""


def record_drift(record_property, results: list[dict]) -> None:
    """Max abs/rel difference per full gradient (worst rank) and of the loss, for the drift report."""
    for name in sorted(results[0]["drift"]):
        record_property(f"grad_max_abs/{name}", max(r["drift"][name][0] for r in results if name in r["drift"]))
        record_property(f"grad_max_rel/{name}", max(r["drift"][name][1] for r in results if name in r["drift"]))
    record_property("loss_max_abs", max(abs(r["loss"][0] - r["loss"][1]) for r in results))
    record_property("grad_max_ulp", max(r["ulp"] for r in results))


@pytest.mark.parametrize("dropout", [0.0, DROPOUT])
def test_checkpointing_leaves_loss_and_gradients_unchanged(
    cell, ranks, components, suite_options, record_property, dropout
):
    """Same seed, batch and sharding: checkpointing must leave the loss and every gradient unchanged.

    dropout=0 isolates the KV-cache recompute order; dropout>0 adds the RNG replay of recompute,
    and skips when forward drew no random numbers (the model has no dropout: nothing to replay).
    Fails when no layer body ran again in backward: checkpointing was not applied, so the step was
    compared with itself.
    """
    precision = precision_from(suite_options)
    results = ranks.run(compare_gradients, cell, components, precision, dropout)
    precision = results[0]["precision"]
    record_property("precision", precision.describe())
    record_drift(record_property, results)
    require_gradients_and_recompute(cell, results)

    init = {f"rank {rank}": r["init"] for rank, r in enumerate(results) if r["init"]}
    if init:
        raise AssertionError(
            failure_text(
                cell,
                precision,
                "the two models differ before training: the model factory is not deterministic under torch.manual_seed",
                init,
            )
        )
    problems = gradient_problems(results, "loss")
    if problems:
        raise AssertionError(
            failure_text(
                cell,
                precision,
                f"checkpointing changed the loss or gradients (dropout={dropout}; with checkpointing first, without second)",
                problems,
                GRADIENTS_HINT,
            )
        )
    if dropout and not any(r["drew_random_numbers"] for r in results):
        pytest.skip(dropout_changed_nothing(dropout))


ANOTHER_LENGTH_EAGER = (
    "an eager cell keeps no graph per sequence length: the forward at another length (pytorch#166926's class) "
    "is a compiled cell's check"
)


def test_forward_at_another_length_leaves_gradients_unchanged(cell, ranks, components, suite_options, record_property):
    """In a compiled cell, a forward at another sequence length between forward and backward (Dynamo
    recompiles the blocks with dynamic shapes, and recompute may pick that graph: pytorch#166926)
    leaves the loss and every gradient as checkpointing without it does. Its own test, so an upstream
    failure of that recompile is expected here alone and every other comparison still runs."""
    if compile_mode(cell) is None:
        pytest.skip(ANOTHER_LENGTH_EAGER)
    results = ranks.run(compare_gradients, cell, components, precision_from(suite_options), 0.0, 1, True)
    record_property("precision", results[0]["precision"].describe())
    record_drift(record_property, results)
    require_unchanged_gradients(
        cell, results, "loss", "with a forward at another sequence length before backward, checkpointing changed"
    )


def require_unchanged_gradients(cell, results: list[dict], loss_name: str, headline: str) -> None:
    """Fail unless checkpointing was applied and left the loss (named `loss_name`) and every gradient
    as the step without it computed them; `headline` says under what the comparison ran."""
    require_gradients_and_recompute(cell, results)
    problems = gradient_problems(results, loss_name)
    if problems:
        raise AssertionError(
            failure_text(
                cell,
                results[0]["precision"],
                f"{headline} the loss or gradients (with checkpointing first, without second)",
                problems,
                GRADIENTS_HINT,
            )
        )


def dropout_changed_nothing(dropout: float) -> str:
    return (
        f"dropout changed nothing: the model has none (forward with dropout={dropout} drew no random numbers "
        f"on any rank), so there is no RNG replay to check; dropout=0.0 ran the same comparison"
    )


def cache_presence_problems(entries_without: int, entries_with: int) -> list[str]:
    """A cache that one run returned and the other did not (None or empty): checkpointing lost or
    invented it. Neither run returning one is no problem: the model has no cache."""
    if entries_without and not entries_with:
        return [
            f"the model returned a cache of {entries_without} entries without checkpointing and none with it "
            f"(None or empty): checkpointing lost the cache"
        ]
    if entries_with and not entries_without:
        return [
            f"the model returned a cache of {entries_with} entries with checkpointing and none without it "
            f"(None or empty): checkpointing invented the cache"
        ]
    return []


CACHE_SOURCES = {
    "output": "the past_key_values the model returned",
    "hook": "found by the cache hook: a container forward handed to its checkpointed units",
}

UNSEEN_OUTPUT = (
    "the training step's loss ran no module of the model outside compiled code, so no past_key_values "
    "could be read from what the model returned"
)


def no_cache_reason(has_cache: tuple[bool, bool], cache_source: str = "output") -> str:
    if cache_source == "unseen":
        return (
            f"no cache found ({UNSEEN_OUTPUT}) and none handed to a checkpointed unit (the cache hook saw no "
            f"container holding tensors): layer reruns checked, no cache to compare"
        )
    returned = "past_key_values=None" if not any(has_cache) else "an empty past_key_values"
    return (
        f"the model returned no cache ({returned}, with and without checkpointing) and handed none to a "
        f"checkpointed unit (the cache hook saw no container holding tensors): layer reruns checked, no cache to compare"
    )


def test_recompute_reruns_layers_and_rewrites_cache_identically(cell, ranks, components, suite_options):
    """Backward must re-execute every checkpointed layer body, and the reruns must leave the KV cache
    as forward did: its tensors and its non-tensor state (counters, lengths), also against eager.
    In a compiled cell, where no Python body reruns, checkpointing must have left less saved for backward."""
    precision = precision_from(suite_options)
    results = ranks.run(inspect_recompute, cell, components, precision, DROPOUT)
    precision = results[0]["precision"]
    problems = {}
    conclusion = None
    for rank, result in enumerate(results):
        after_forward, after_backward = result["calls"]["with"]
        found = (
            [] if after_forward else [f"{result['counted_by']} names no layer: there is nothing to check recompute on"]
        )
        if compile_mode(cell) is None:
            found += [
                f"layer {layer}: body ran {after_forward[layer]}x in forward and not again in backward with checkpointing"
                for layer in after_forward
                if after_backward[layer] <= after_forward[layer]
            ]
        elif not compiled_checkpointing_shown(cell, result):
            found.append(f"checkpointing was not applied: {saved_bytes_line(result)}")
        plain_forward, plain_backward = result["calls"]["without"]
        found += [
            f"layer {layer}: body ran again in backward without checkpointing"
            for layer in plain_forward
            if plain_backward[layer] != plain_forward[layer]
        ]
        found += [f"{p} (after forward; with checkpointing first, without second)" for p in result["cache_forward"]]
        found += cache_presence_problems(*result["cache_entries"])
        found += [
            f"{p} (with checkpointing; after backward first, after forward second)" for p in result["cache_backward"]
        ]
        found += [
            f"{p} (with checkpointing; after backward first, after forward second)" for p in result["state_backward"]
        ]
        found += [f"{p} (after backward; with checkpointing first, without second)" for p in result["state_vs_eager"]]
        if all(result["cache_entries"]) and not result["recompute_writes"] and compile_mode(cell) is None:
            found.append(
                "could not observe recompute writing the cache: after backward with checkpointing every tensor "
                f"of the cache ({CACHE_SOURCES[result['cache_source']]}) is the one forward left, unchanged (same object, "
                "same version), so the cache checks compared nothing recompute did; either no layer that "
                "writes the cache is checkpointed, or the object returned is not the one recompute writes to "
                "(a wrapper or the model copied it)"
            )
        if found:
            problems[f"rank {rank}"] = found
            conclusion = conclusion or recompute_conclusion(result, found)
    if problems:
        headline, hint = conclusion
        raise AssertionError(failure_text(cell, precision, headline, problems, hint))
    if not any(entries for r in results for entries in r["cache_entries"]):
        pytest.skip(no_cache_reason(results[0]["has_cache"], results[0]["cache_source"]))


@pytest.fixture
def module_state_run(cell, ranks, components, suite_options, once_per_cell) -> list[dict]:
    """Buffers and module attributes after one step with and without checkpointing, run once per cell."""
    precision = precision_from(suite_options)
    ignored = suite_options.ignored_attributes
    return once_per_cell(
        "the module-state steps", lambda: ranks.run(compare_module_state, cell, components, precision, DROPOUT, ignored)
    )


def test_checkpointing_leaves_every_buffer_unchanged(cell, module_state_run, suite_options):
    """After forward+backward, every buffer (running statistics, token or routing counters) must
    equal eager's exactly: a buffer that forward updates is updated again by recompute."""
    precision = precision_from(suite_options)
    results = module_state_run
    if not results[0]["names"]:
        pytest.skip("the model has no buffers (named_buffers() is empty): nothing for recompute to change")
    problems = {f"rank {rank}": r["problems"] for rank, r in enumerate(results) if r["problems"]}
    if problems:
        raise AssertionError(
            failure_text(
                cell,
                precision,
                f"checkpointing changed buffers (exact; with checkpointing first, without second; compared {', '.join(results[0]['names'])})",
                problems,
            )
        )


def test_checkpointing_leaves_module_attributes_unchanged(cell, module_state_run, suite_options):
    """After forward+backward, every module's own attributes that hold tensors, numbers, strings or
    containers of them (an aux-loss list a trainer sums, a per-layer dict, an int) must equal eager's
    exactly: forward appends to or bumps them, and recompute runs forward's code a second time.
    The ints ``body_calls()`` reports are the one state recompute must change; they are found by
    moving each int and seeing ``body_calls()`` move, and left out, as are the attribute names of
    option ``ignored_attributes``."""
    precision = precision_from(suite_options)
    results = module_state_run
    if not any(r["attributes"] for r in results):
        pytest.skip(
            "no module holds an attribute of tensors, numbers, strings or containers of them: nothing to compare"
        )
    problems = {
        f"rank {rank}": [f"module attribute {line}" for line in r["attribute_problems"]]
        for rank, r in enumerate(results)
        if r["attribute_problems"]
    }
    if problems:
        raise AssertionError(
            failure_text(
                cell,
                precision,
                "checkpointing changed module attributes (exact; with checkpointing first, without second; "
                f"left out as what body_calls() reports: {', '.join(results[0]['counters']) or 'nothing'})",
                problems,
            )
        )


def test_micro_batches_before_one_backward_leave_gradients_unchanged(
    cell, ranks, components, suite_options, record_property
):
    """K micro-batches (option ``micro_batches``, default 2) run forward, their losses summed, before one
    backward, as gradient accumulation and pipeline schedules do: each micro-batch's recompute then
    runs after the later micro-batches' forwards, so state a model keeps across calls (a cache held on
    the module, a per-call counter) that forward→backward never exercises is read by the wrong recompute.
    The summed loss and every gradient must equal eager's as in the single-batch test."""
    micro_batches = suite_options.micro_batches
    results = ranks.run(compare_gradients, cell, components, precision_from(suite_options), 0.0, micro_batches)
    record_property("micro_batches", micro_batches)
    require_unchanged_gradients(
        cell,
        results,
        "summed loss",
        f"with {micro_batches} micro-batches forward before one backward, checkpointing changed",
    )


NO_COMPILED_STEP = (
    'an eager cell (compile = "none"): no compiled step to compare with eager; every compiled cell compares its own'
)
NO_BF16_BOUND = (
    "bfloat16 under a kernel-generating backend: it rounds a fused chain to bf16 once where eager rounds after "
    "every op, so the twins may differ by a bf16 ulp (2**-8) per op and no useful bound is left"
)
EAGER_TWIN_HINT = (
    "the compiled model must compute what the eager one does: update state inside the traced code, not under "
    "`if not torch.compiler.is_compiling()`; read a value that changes (a step, a schedule, a flag) where Dynamo "
    "guards it, not through `assume_constant_result` or a function `allow_in_graph` hides from it"
)


def test_compiled_steps_match_their_eager_twin(cell, ranks, components, suite_options, record_property):
    """Each of a few compiled steps (forward, backward, the same SGD update on both) must leave the same loss,
    gradients and buffers as its eager twin: the same components built again from the same seed and stepped
    under ``torch.compiler.set_stance("force_eager")`` (suites/eager_twin.py). A model that computes something
    else once compiled is consistent with itself everywhere else; the failure names the first tensor that differs."""
    if compile_mode(cell) is None:
        pytest.skip(NO_COMPILED_STEP)
    precision = precision_from(suite_options)
    bound = twin_bound(cell, precision.bf16)
    if bound is None:
        pytest.skip(NO_BF16_BOUND)
    results = ranks.run(compare_with_eager_twin, cell, components, precision.dtype, bound)
    record_property("eager_twin_comparison", bound.describe())
    record_property("eager_twin_max_ulp", max(r["max_ulp"] for r in results))
    if not bound.exact:
        record_property("eager_twin_bound_used", max(r["bound_used"] for r in results))
    initial = {f"rank {rank}": r["initial"] for rank, r in enumerate(results) if r["initial"]}
    if initial:
        raise AssertionError(
            failure_text(
                cell,
                bound,
                "the twins differ before training: the model factory is not deterministic under torch.manual_seed",
                initial,
            )
        )
    first = first_difference(results)
    if first:
        step, rank, line, largest = first
        raise AssertionError(
            failure_text(
                cell,
                bound,
                f"the compiled steps differ from their eager twin (compiled first, eager second): first at step {step} "
                f"of {TWIN_STEPS}, rank {rank}: {line}; largest that step: {largest}",
                {f"step {step}": step_lines(results, step)},
                EAGER_TWIN_HINT,
            )
        )
