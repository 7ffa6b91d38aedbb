"""What a grad_ckpt failure says: the problems found in a step's records, grouped and shown a few at
a time, with the hint that sends the user to what to change (a checkpoint policy, a cache write, a
layer checkpointing never reran)."""

from __future__ import annotations

from .grad_ckpt_precision import Precision
from .grad_ckpt_steps import compile_mode


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
