"""Activation checkpointing must not change gradients, even when layers mutate a KV cache.

Per cell: the ``model`` component is built twice from one seed, without and with per-layer
checkpointing, wrapped by the ``parallelize`` component for the cell's ``fsdp``, and run
forward+backward on the same per-rank ``batch``. Gradients (local shards and full tensors)
and losses must match exactly in float32, or within the bf16 tolerance of
``[suites.grad_ckpt.options]``; recompute must really run and leave the cache as forward left
it. Why: a per-tensor gradient difference with mean ~0 hides in loss curves (the public
report "pi05 grad-ckpt + KV cache: pin gradient-equivalence with a focused regression test").

Model contract (beyond the factory signatures in torchmatrix/protocol.py): ``model(**batch)``
returns an output with ``.loss`` and ``.past_key_values``, the cache a mapping of layer ->
tuple of tensors, and ``model.body_calls()`` maps each layer to how often its body ran.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.tensor import DTensor

from suites.deterministic import deterministic_algorithms
from torchmatrix.components import load
from torchmatrix.worker import current_device

SEED = 0
DROPOUT = 0.1
FSDP_NAME_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


@dataclass(frozen=True)
class Precision:
    """The dtype the models run in and how close checkpointed gradients must be to the reference."""

    dtype: str
    rtol: float
    atol: float

    def describe(self) -> str:
        if self.dtype == "float32":
            return "float32, exact (rtol=0, atol=0)"
        return f"{self.dtype}, rtol={self.rtol}, atol={self.atol} from [suites.grad_ckpt.options]"


def precision_from(options: dict) -> Precision:
    """float32 is compared exactly; bfloat16 needs bf16_rtol and bf16_atol in the suite options."""
    dtype = options.get("dtype", "float32")
    if dtype == "float32":
        return Precision("float32", 0.0, 0.0)
    if dtype == "bfloat16":
        missing = [key for key in ("bf16_rtol", "bf16_atol") if key not in options]
        if missing:
            pytest.fail(f'[suites.grad_ckpt.options] dtype = "bfloat16" needs {" and ".join(missing)} in matrix.toml')
        return Precision("bfloat16", float(options["bf16_rtol"]), float(options["bf16_atol"]))
    pytest.fail(f'[suites.grad_ckpt.options] dtype = {dtype!r}: expected "float32" or "bfloat16"')


def clean_name(name: str) -> str:
    """A parameter's name as the user's model spells it, without FSDP1/checkpoint-wrapper prefixes."""
    for prefix in FSDP_NAME_PREFIXES:
        name = name.replace(prefix, "")
    return name


def local_tensor(tensor):
    """This rank's shard of a DTensor (FSDP2), or the tensor itself (FSDP1 flat-param views, no FSDP)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def local_gradients(model) -> dict:
    return {
        clean_name(n): local_tensor(p.grad).detach().clone() for n, p in model.named_parameters() if p.grad is not None
    }


def full_gradients(model) -> dict:
    """Unsharded gradients: DTensor.full_tensor for FSDP2, summon_full_params(with_grads=True) for FSDP1."""
    if isinstance(model, FullyShardedDataParallel):
        with FullyShardedDataParallel.summon_full_params(model, with_grads=True):
            return {clean_name(n): p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return {
        clean_name(n): (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
        for n, p in model.named_parameters()
        if p.grad is not None
    }


def local_parameters(model) -> dict:
    return {clean_name(n): local_tensor(p).detach().clone() for n, p in model.named_parameters()}


def cache_snapshot(cache) -> dict:
    return {layer: tuple(t.detach().clone() for t in entry) for layer, entry in cache.items()}


def cache_tensors(snapshot: dict) -> dict:
    """A cache snapshot flattened to names like ``past_key_values[0][1]`` (layer 0, values)."""
    return {
        f"past_key_values[{layer}][{i}]": tensor for layer, entry in snapshot.items() for i, tensor in enumerate(entry)
    }


def drift(actual, expected) -> tuple[float, float]:
    """Max absolute and max relative difference (0/0 counts as 0, x/0 as inf), in float64."""
    if actual.numel() == 0:
        return 0.0, 0.0
    actual, expected = actual.double(), expected.double()
    abs_diff = (actual - expected).abs()
    rel_diff = torch.where(abs_diff == 0, torch.zeros_like(abs_diff), abs_diff / expected.abs())
    return abs_diff.max().item(), rel_diff.max().item()


def mismatch(actual, expected, precision: Precision) -> str | None:
    """None when the tensors agree under ``precision``, else why not (shape or max abs/rel diff)."""
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)} vs {tuple(expected.shape)}"
    try:
        torch.testing.assert_close(actual, expected, rtol=precision.rtol, atol=precision.atol)
    except AssertionError:
        max_abs, max_rel = drift(actual, expected)
        return f"max abs diff {max_abs:.3e}, max rel diff {max_rel:.3e}"
    return None


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
    cache_after_forward: dict
    cache_after_backward: dict


@contextmanager
def failing_stage(cell, what: str):
    """Re-raise an error of ``what`` naming the cell and torch version: a broken combination fails, never skips."""
    try:
        yield
    except Exception as error:
        raise RuntimeError(f"cell {cell.id}, torch {torch.__version__}: {what} failed: {error!r}") from error


def train_step(cell, components: dict, precision: Precision, dropout: float, checkpointing: bool) -> StepRecord:
    """Build, wrap, and run one forward+backward on this rank; failures say which stage broke."""
    build_model, parallelize, make_batch = (load(components[name]) for name in ("model", "parallelize", "batch"))
    device = current_device()
    rank = dist.get_rank() if dist.is_initialized() else 0
    mode = "with" if checkpointing else "without"
    torch.manual_seed(SEED)
    with failing_stage(cell, f"building the model ({components['model']})"):
        model = build_model(cell, dropout=dropout, dtype=getattr(torch, precision.dtype))
        batch = make_batch(model, seed=SEED + 1 + rank, device=device)
    with failing_stage(cell, f"parallelize (fsdp={cell['fsdp']}) {mode} activation checkpointing"):
        model = parallelize(model, cell, device=device, activation_checkpointing=checkpointing)
    model.train()
    parameters = local_parameters(model)
    torch.manual_seed(SEED + 1000 + rank)
    with failing_stage(cell, f"forward {mode} activation checkpointing"):
        output = model(**batch)
    loss, cache = output.loss, output.past_key_values
    calls_after_forward = model.body_calls()
    cache_after_forward = cache_snapshot(cache)
    with failing_stage(
        cell, f"backward {mode} activation checkpointing (did a recomputed layer differ from its forward?)"
    ):
        loss.backward()
    return StepRecord(
        loss=loss.detach().float().cpu(),
        parameters=parameters,
        local_grads=local_gradients(model),
        full_grads=full_gradients(model),
        calls_after_forward=calls_after_forward,
        calls_after_backward=model.body_calls(),
        cache_after_forward=cache_after_forward,
        cache_after_backward=cache_snapshot(cache),
    )


def shards_only(local: dict, full: dict) -> dict:
    """The local gradients that are real shards; an unsharded one is already checked as a full tensor."""
    return {name: grad for name, grad in local.items() if name not in full or grad.shape != full[name].shape}


def both_steps(cell, components: dict, precision: Precision, dropout: float) -> tuple[StepRecord, StepRecord]:
    """The step without, then with, activation checkpointing, under deterministic kernels."""
    with deterministic_algorithms():
        return (
            train_step(cell, components, precision, dropout, checkpointing=False),
            train_step(cell, components, precision, dropout, checkpointing=True),
        )


def compare_gradients(cell, components: dict, precision: Precision, dropout: float) -> dict:
    """Rank function: one step without and one with checkpointing; the differences, as plain data."""
    without_ckpt, with_ckpt = both_steps(cell, components, precision, dropout)
    return {
        "init": compare_tensors(
            "parameter", with_ckpt.parameters, without_ckpt.parameters, Precision("float32", 0.0, 0.0)
        ),
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
    }


def inspect_recompute(cell, components: dict, precision: Precision, dropout: float) -> dict:
    """Rank function: layer body counts and cache entries around backward, with and without checkpointing."""
    without_ckpt, with_ckpt = both_steps(cell, components, precision, dropout)
    return {
        "calls": {
            "without": (without_ckpt.calls_after_forward, without_ckpt.calls_after_backward),
            "with": (with_ckpt.calls_after_forward, with_ckpt.calls_after_backward),
        },
        "cache_backward": compare_tensors(
            "cache entry",
            cache_tensors(with_ckpt.cache_after_backward),
            cache_tensors(with_ckpt.cache_after_forward),
            precision,
        ),
        "cache_forward": compare_tensors(
            "cache entry",
            cache_tensors(with_ckpt.cache_after_forward),
            cache_tensors(without_ckpt.cache_after_forward),
            precision,
        ),
    }


def failure_text(cell, precision: Precision, headline: str, problems: dict[str, list[str]]) -> str:
    """The assertion message: cell, dtype and tolerance, what went wrong, then one line per tensor."""
    lines = [f"cell {cell.id} ({precision.describe()}): {headline}"]
    for where, found in problems.items():
        lines += [f"  {where}: {problem}" for problem in found]
    return "\n".join(lines)


def record_drift(record_property, results: list[dict]) -> None:
    """Max abs/rel difference per full gradient (worst rank) and of the loss, for the drift report."""
    for name in sorted(results[0]["drift"]):
        record_property(f"grad_max_abs/{name}", max(r["drift"][name][0] for r in results if name in r["drift"]))
        record_property(f"grad_max_rel/{name}", max(r["drift"][name][1] for r in results if name in r["drift"]))
    record_property("loss_max_abs", max(abs(r["loss"][0] - r["loss"][1]) for r in results))


@pytest.mark.parametrize("dropout", [0.0, DROPOUT])
def test_checkpointing_leaves_loss_and_gradients_unchanged(
    cell, ranks, components, suite_options, record_property, dropout
):
    """Same seed, batch and sharding: checkpointing must leave the loss and every gradient unchanged.

    dropout=0 isolates the KV-cache recompute order; dropout>0 adds the RNG replay of recompute.
    """
    precision = precision_from(suite_options)
    results = ranks.run(compare_gradients, cell, components, precision, dropout)
    record_drift(record_property, results)

    init = {f"rank {rank}": r["init"] for rank, r in enumerate(results) if r["init"]}
    assert not init, failure_text(
        cell,
        precision,
        "the two models differ before training: the model factory is not deterministic under torch.manual_seed",
        init,
    )
    problems = {}
    for rank, result in enumerate(results):
        without_ckpt, with_ckpt, loss_reason = result["loss"]
        found = [f"loss {with_ckpt!r} vs {without_ckpt!r}: {loss_reason}"] if loss_reason else []
        if found + result["local"]:
            problems[f"rank {rank}"] = found + result["local"]
    if results[0]["full"]:
        problems["every rank"] = results[0]["full"]
    assert not problems, failure_text(
        cell,
        precision,
        f"checkpointing changed the loss or gradients (dropout={dropout}; with checkpointing first, without second)",
        problems,
    )


def test_recompute_reruns_layers_and_rewrites_cache_identically(cell, ranks, components, suite_options):
    """Backward must re-execute every checkpointed layer body, and the reruns must leave the KV cache as forward did."""
    precision = precision_from(suite_options)
    results = ranks.run(inspect_recompute, cell, components, precision, DROPOUT)
    problems = {}
    for rank, result in enumerate(results):
        after_forward, after_backward = result["calls"]["with"]
        found = [
            f"layer {layer}: body ran {after_forward[layer]}x in forward and not again in backward with checkpointing"
            for layer in after_forward
            if after_backward[layer] <= after_forward[layer]
        ]
        plain_forward, plain_backward = result["calls"]["without"]
        found += [
            f"layer {layer}: body ran again in backward without checkpointing"
            for layer in plain_forward
            if plain_backward[layer] != plain_forward[layer]
        ]
        found += [f"{p} (after forward; with checkpointing first, without second)" for p in result["cache_forward"]]
        found += [
            f"{p} (with checkpointing; after backward first, after forward second)" for p in result["cache_backward"]
        ]
        if found:
            problems[f"rank {rank}"] = found
    assert not problems, failure_text(
        cell, precision, "recompute did not rerun the layers, or left the KV cache different from forward", problems
    )
