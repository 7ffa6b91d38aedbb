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
  steps are also compared with their eager twin (suites/references/eager_twin.py): the same components stepped
  under ``force_eager``, bit for bit under aot_eager, within ``STEP_RTOL`` per step under a
  kernel-generating backend, naming the first tensor that differs.
- The loss and the backward are the stack's `training_step` component's (`loss`, `backward`;
  suites/components/training_step.py), built with `optimizer=None`: grad_ckpt takes no optimizer step.
- Model contract (beyond torchmatrix/components/protocol.py): without a `training_step` the loss is read as
  suites/components/model_output.py says; the cache from the output's ``past_key_values`` or through the
  containers forward hands its checkpointed units (suites/recompute/checkpoint_units.py); recompute is counted
  by ``model.body_calls()`` or the suite's instrumented ``torch.utils.checkpoint.checkpoint``; a model
  computing in another dtype declares ``compute_dtype`` (or option ``compute_dtype``).
- Options: ``GradCkptOptions`` (torchmatrix/matrix/suite_options.py).
"""

from __future__ import annotations

import pytest

from torchmatrix.testing import (
    GradCkptOptions,
)

from .comparison.ulp import ulp_distance
from .recompute.grad_ckpt_findings import (
    CACHE_SOURCES,
    GRADIENTS_HINT,
    cache_presence_problems,
    compiled_checkpointing_shown,
    dropout_changed_nothing,
    failure_text,
    gradient_problems,
    no_cache_reason,
    recompute_conclusion,
    record_drift,
    require_gradients_and_recompute,
    require_unchanged_gradients,
    saved_bytes_line,
)
from .recompute.grad_ckpt_precision import (
    EXACT,
    Precision,
    compare_tensors,
    compare_values,
    drift,
    mismatch,
    precision_from,
)
from .recompute.grad_ckpt_steps import both_steps, compile_mode, shards_only
from .references.eager_twin import (
    TWIN_STEPS,
    compare_with_eager_twin,
    first_difference,
    step_lines,
    twin_bound,
)
from .state.module_state_walk import module_state_problems

OPTIONS = GradCkptOptions  # the dataclass `suite_options` arrives as

DROPOUT = 0.1


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


def dropout_findings(cell, components: dict, precision: Precision, ignored: tuple[str, ...]) -> dict:
    """Rank function: the gradient, recompute and module-state findings at ``DROPOUT``, which read the same
    pair of steps; one call for the three, so a pair that fails (the modern stack's known failure) compiles
    and fails once for the four tests that read it, not once each in a fresh pool."""
    return {
        "gradients": compare_gradients(cell, components, precision, DROPOUT),
        "recompute": inspect_recompute(cell, components, precision, DROPOUT),
        "module_state": compare_module_state(cell, components, precision, DROPOUT, ignored),
    }


def dropout_run(cell, ranks, components, suite_options, once_per_cell) -> list[dict]:
    """Each rank's `dropout_findings`, run once per cell and shared by the tests that read them; where the
    run failed, each of them fails with its whole report (the stage and layer it names), as its own run would."""
    precision = precision_from(suite_options)
    ignored = suite_options.ignored_attributes

    def run() -> list[dict] | Exception:
        try:
            return ranks.run(dropout_findings, cell, components, precision, ignored)
        except Exception as failure:
            return failure

    outcome = once_per_cell("the steps with dropout", run)
    if isinstance(outcome, Exception):
        raise outcome.with_traceback(None)
    return outcome


@pytest.mark.parametrize("dropout", [0.0, DROPOUT])
def test_checkpointing_leaves_loss_and_gradients_unchanged(
    cell, ranks, components, suite_options, record_property, once_per_cell, dropout
):
    """Same seed, batch and sharding: checkpointing must leave the loss and every gradient unchanged.

    dropout=0 isolates the KV-cache recompute order; dropout>0 adds the RNG replay of recompute,
    and skips when forward drew no random numbers (the model has no dropout: nothing to replay).
    Fails when no layer body ran again in backward: checkpointing was not applied, so the step was
    compared with itself.
    """
    precision = precision_from(suite_options)
    if dropout == DROPOUT:
        results = [r["gradients"] for r in dropout_run(cell, ranks, components, suite_options, once_per_cell)]
    else:
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


def test_recompute_reruns_layers_and_rewrites_cache_identically(cell, ranks, components, suite_options, once_per_cell):
    """Backward must re-execute every checkpointed layer body, and the reruns must leave the KV cache
    as forward did: its tensors and its non-tensor state (counters, lengths), also against eager.
    In a compiled cell, where no Python body reruns, checkpointing must have left less saved for backward."""
    results = [r["recompute"] for r in dropout_run(cell, ranks, components, suite_options, once_per_cell)]
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
    """Buffers and module attributes after one step with and without checkpointing, from the cell's one dropout run."""
    return [r["module_state"] for r in dropout_run(cell, ranks, components, suite_options, once_per_cell)]


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
    under ``torch.compiler.set_stance("force_eager")`` (suites/references/eager_twin.py). A model that computes something
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
