"""Resume exactness: a run checkpointed at step K and resumed is bit for bit the run that never stopped.

- Run A trains N steps straight; run B trains K, saves, rebuilds everything from another seed (a
  load that restores nothing cannot pass), loads, trains N - K (shared/seeds/resume-optimizer-moments.txt).
- Right after the load each piece is compared with what was saved, bit for bit (suites/comparison/ulp.py), and
  a failure names it: parameters (full and each rank's shards), optimizer state (through its state
  adapter, `step` included) with its dtype and device, param groups, the optimizer's own scalars,
  the scheduler, the loader's next batches (across an epoch boundary), every RNG stream training
  advanced (torchmatrix.testing.rng_streams, and generators the model, dataset and loader own), and
  the checkpointer's extra state.
- Some ranks restored and others not is named as such; a comparison over nothing fails; a piece the
  rebuilt run already held before the load skips, saying why.
- Then the resumed losses (`loss_max_ulp` recorded), final parameters and optimizer state must equal
  the straight run's, bit for bit (-0.0 is not 0.0).
- Run B saves twice (at K - 1 and K, with the same checkpointer) and steps after each save: the loaded
  checkpoint must hold the state at K, neither the next step's nor the previous save's, and a
  second save must work. In the cells option `async_save` names, `checkpointer_async` saves and the
  optimizer steps before the save's future resolves, as the official recipe does (suites/checkpoints/held_steps.py).
- With an `optimizer_impl` axis the checkpoint of a cell stepping an implementation other than the
  default also loads into each other implementation the factory builds
  (docs/explanation/optimizer-implementations.md).
- Components: `model`, `parallelize`, `optimizer_<optimizer>`, `checkpointer` (either form of
  suites/checkpoints/checkpointer_forms.py), `dataset`, optionally `scheduler` and `plain_state_<optimizer>`.
- Options: `ResumeOptions` (torchmatrix/matrix/suite_options.py); each rank sends its `RankRecord`
  (suites/training_runs/resumed_run.py, the rank function; what differs after the load: restored_state.py).
"""

from __future__ import annotations

import pytest

from torchmatrix.testing import (
    CONSEQUENCE_OF,
    DEFAULT_IMPLEMENTATION,
    IMPLEMENTATION_AXIS,
    ResumeOptions,
    bits_equal,
    checkpointer_path,
    consequence_of,
    implementation_of,
    saves_asynchronously,
)

from .comparison.ulp import ulp_distance
from .training_runs.implementation_loads import DEFAULT_LOADS_NOTHING, loads_into_others
from .training_runs.restored_state import (
    AFTER_LOAD_PIECES,
    dtype_device_mismatches,
    parameter_mismatches,
    state_mismatches,
)
from .training_runs.resumed_run import RankRecord, SaveFailed, Unavailable, straight_and_resumed
from .training_runs.training_run import write_dataset

OPTIONS = ResumeOptions  # the dataclass `suite_options` arrives as


@pytest.fixture
def runs(cell, ranks, suite_options, components, tmp_path, once_per_cell) -> list:
    """Both runs of the cell, one record per rank (or why they stopped); run once per cell and shared by its tests."""

    def both_runs() -> list[RankRecord | Unavailable | SaveFailed]:
        options = suite_options
        data_path = str(tmp_path / "tokens.pt")
        write_dataset(components, options, data_path)
        asynchronous = saves_asynchronously(cell.id, options.async_save)
        saving = {**components, "checkpointer": checkpointer_path(components, asynchronous)}
        checkpoint_dir = str(tmp_path / "checkpoint")
        return ranks.run(straight_and_resumed, dict(cell), options, saving, data_path, checkpoint_dir, asynchronous)

    records = once_per_cell("the training runs", both_runs)
    if isinstance(records[0], Unavailable):
        pytest.skip(records[0].reason)
    return records


@pytest.fixture
def experiment(runs) -> list[RankRecord]:
    """Both runs' records, where the run got as far as loading a checkpoint."""
    failed = [record for record in runs if isinstance(record, SaveFailed)]
    if failed:
        pytest.skip(
            f"no checkpoint to load: {failed[0].reason} (test_checkpoint_holds_the_state_at_its_save fails on it)"
        )
    return runs


def test_checkpoint_holds_the_state_at_its_save(cell, runs, suite_options, record_property):
    """The loaded checkpoint holds the state at its save, not that of the step the trainer took right
    after it (an asynchronous save in flight, its staging copy skipped) nor the previous save's, and
    the checkpointer saves a second time. `save_in_flight` records whether an asynchronous upload
    was still running when the optimizer stepped: where it was not, the step could not reach it."""
    failed = [f"  rank {rank}: {record.reason}" for rank, record in enumerate(runs) if isinstance(record, SaveFailed)]
    if failed:
        raise AssertionError(f"{cell.id}: a save failed:\n" + "\n".join(failed))
    in_flight = sorted({record.save_in_flight for record in runs} - {"synchronous"})
    if in_flight:
        record_property("save_in_flight", ", ".join(in_flight))
    lines = [f"  rank {rank}: {line}" for rank, record in enumerate(runs) for line in record.held_steps]
    if lines:
        step = suite_options.resume_step
        raise AssertionError(
            f"{cell.id}, the checkpoint saved at step {step} vs the state at step {step}:\n" + "\n".join(lines)
        )


def test_rebuilt_run_starts_from_other_weights(cell, experiment, suite_options, record_property):
    """Guards the suite itself: the rebuilt run must differ before the load, or a no-op load would
    pass; and an optimizer of option `quantized_state_optimizers` must hold quantized state at the
    checkpoint on every rank, or the checks below compared plain floats."""
    records = experiment
    for rank, record in enumerate(records):
        assert not record.rebuilt_equals_saved, (
            f"{cell.id} rank {rank}: the rebuilt model already equals the checkpointed one; the rebuild seed has no effect"
        )
    if cell["optimizer"] in suite_options.quantized_state_optimizers:
        record_property("quantized_states", [len(record.quantized_at_save) for record in records])
        plain = [rank for rank, record in enumerate(records) if not record.quantized_at_save]
        if plain:
            raise AssertionError(
                f"{cell.id}: ranks {plain} hold no quantized optimizer state at the checkpoint step (all plain floats): "
                f"the params are too small for {cell['optimizer']}'s quantizer, so this cell checked unquantized state"
            )


# piece -> why its check proves nothing when the rebuilt run already held the saved value before the load
NO_OP_LOAD_WOULD_PASS = {
    "parameters": "the rebuilt model already equalled the saved one before the load (see test_rebuilt_run_starts_from_other_weights)",
    "optimizer_state": "the fresh optimizer already held the saved state before the load: a load that restored nothing would pass",
    "optimizer_state_dtype_device": "the fresh optimizer's state already had the saved dtypes and devices before the load: a load that restored nothing would pass",
    "param_groups": "the fresh optimizer's param groups already equalled the saved ones before the load (warm-up ended by the save step?): a load that restored nothing would pass",
    "scheduler": "the fresh scheduler already equalled the saved one before the load: a load that restored nothing would pass",
    "loader": "the fresh loader already yielded the saved next batch before the load (the dataset repeats one batch?): its position cannot be told apart",
    "rng": "the rebuilt run's RNG streams already equalled the saved ones before the load: a load that restored nothing would pass",
}
NOTHING_TO_COMPARE = {
    "extra_state": "the checkpointer's save returned no extra state (None or an empty mapping): nothing besides the step to compare",
}
# piece -> the after-load entry that holds each rank's own part of it, and what to call it
OWN_PART = {"parameters": ("parameter_shards", "parameters"), "optimizer_state": ("optimizer_state", "optimizer state")}


@pytest.mark.parametrize("piece", AFTER_LOAD_PIECES)
def test_state_restored_right_after_load(cell, experiment, piece):
    """Right after load, before any step: this piece of state equals what was saved, or the failure names what differs."""
    records = experiment
    if piece == "rng" and not records[0].rng_streams_used:
        pytest.skip(
            "training advanced no RNG stream (torch CPU, CUDA, numpy, python random) and no generator the "
            "model, dataset, loader, optimizer or scheduler owns: no RNG state to resume"
        )
    problems = {rank: record.after_load[piece] for rank, record in enumerate(records) if record.after_load[piece]}
    listing = [f"  across ranks: {line}" for line in partial_restore(piece, records) + rank_zero_rng(piece, records)]
    listing += [f"  rank {rank}: {line}" for rank, lines in problems.items() for line in lines]
    if problems:
        raise AssertionError(f"{cell.id}, {piece} right after load vs at save:\n" + "\n".join(listing))
    if piece in NOTHING_TO_COMPARE and not any(record.extra_state_saved for record in records):
        pytest.skip(NOTHING_TO_COMPARE[piece])
    if all(piece in record.equal_before_load for record in records):
        pytest.skip(NO_OP_LOAD_WOULD_PASS[piece])


def rank_zero_rng(piece: str, records: list[RankRecord]) -> list[str]:
    """One line when ranks that saved their own RNG streams came back with rank 0's: a checkpointer
    that keeps rank 0's RNG for every rank, right only for ranks seeded alike (option `seeding`)."""
    if piece != "rng" or len(records) < 2:
        return []
    saved_by_zero = records[0].rng_at_save
    took_zero = [
        rank
        for rank, record in enumerate(records[1:], start=1)
        if record.after_load["rng"] and record.rng_after_load == saved_by_zero != record.rng_at_save
    ]
    if not took_zero:
        return []
    return [
        f"after load: ranks {took_zero} hold the RNG streams rank 0 saved, not their own: the checkpointer restores rank 0's RNG "
        f'on every rank, which is right only if the trainer seeds every rank alike (then set [suites.resume.options] seeding = "replicated")'
    ]


def partial_restore(piece: str, records: list[RankRecord]) -> list[str]:
    """One line when some ranks got their own part of `piece` back and others did not: a load kept
    on some ranks only (rank 0's, say), which full-tensor checks report on every rank alike."""
    if piece not in OWN_PART:
        return []
    entry, what = OWN_PART[piece]
    differing = [rank for rank, record in enumerate(records) if record.after_load[entry]]
    if not differing or len(differing) == len(records):
        return []
    restored = [rank for rank in range(len(records)) if rank not in differing]
    where = "rank 0 only" if restored == [0] else f"ranks {restored} only"
    return [f"after load: {what} restored on {where}: ranks {differing} differ in their own shards"]


def pieces_left_behind(records: list[RankRecord]) -> list[str]:
    """The after-load tests that fail in this cell: a straight-vs-resumed difference follows from them."""
    return [
        f"{test_state_restored_right_after_load.__name__}[piece={piece}]"
        for piece in AFTER_LOAD_PIECES
        if any(record.after_load.get(piece) for record in records)
    ]


def note_consequence(records: list[RankRecord], record_property) -> None:
    """Record which after-load failures a failure of the calling test follows from, for the reports' grouping."""
    if left := pieces_left_behind(records):
        record_property(CONSEQUENCE_OF, consequence_of(left))


def test_losses_identical_after_resume(cell, experiment, suite_options, record_property):
    """Bit for bit: the resumed steps run the same kernels on the same state as the straight ones."""
    note_consequence(experiment, record_property)
    options = suite_options
    first = options.resume_step + 1
    records = experiment
    pairs = [
        (rank, step, a, b)
        for rank, record in enumerate(records)
        for step, (a, b) in enumerate(zip(record.straight.losses[first - 1 :], record.resumed.losses), start=first)
    ]
    assert pairs, f"{cell.id}: no resumed step to compare"
    record_property("loss_max_ulp", max(ulp_distance(b, a) for _, _, a, b in pairs))
    for rank, step, a, b in pairs:
        where = records[rank].first_divergence
        assert bits_equal(b, a), (
            f"{cell.id} rank {rank}: loss at step {step} (resumed at {first - 1}): straight {a.item()!r}, resumed {b.item()!r}, diff {(b - a).item():+.3e}, {ulp_distance(b, a)} ULP"
            + (f"\n{where}" if where else "")
        )


def test_final_parameters_identical(cell, experiment, record_property):
    note_consequence(experiment, record_property)
    for rank, record in enumerate(experiment):
        problems = parameter_mismatches(record.straight.parameters, record.resumed.parameters)
        listing = "\n".join(problems)
        if problems:
            raise AssertionError(f"{cell.id} rank {rank}, final parameters, straight vs resumed:\n{listing}")


def test_final_optimizer_state_identical(cell, experiment, record_property):
    """Every state value bit for bit, and the dtype and device the optimizer keeps it in: a step
    after the load that moves or casts `step` (pytorch#173901) shows here even where the values agree."""
    note_consequence(experiment, record_property)
    for rank, record in enumerate(experiment):
        straight, resumed = record.straight, record.resumed
        problems = state_mismatches(straight.optimizer_state, resumed.optimizer_state)
        problems += dtype_device_mismatches(straight.optimizer_state_dtype_device, resumed.optimizer_state_dtype_device)
        listing = "\n".join(problems)
        if problems:
            raise AssertionError(f"{cell.id} rank {rank}, final optimizer state, straight vs resumed:\n{listing}")


def test_checkpoint_loads_into_other_implementations(cell, experiment, record_property):
    """The checkpoint this cell's optimizer implementation saved, loaded into each other
    implementation its factory builds here (cell axis `optimizer_impl`; not into `compiled`, see
    COMPILED_NOT_A_TARGET): right after the load every parameter, optimizer state value (dtype
    included) and hyper-parameter equals what was saved, the loading optimizer still runs its own
    kernels (torch's load_state_dict takes the kernel flags from the checkpoint), and a step after
    the load runs. Devices are not compared: fused and capturable kernels keep `step` on the param's
    device, the others on the CPU."""
    if IMPLEMENTATION_AXIS not in cell:
        pytest.skip(
            f"the matrix has no {IMPLEMENTATION_AXIS} axis: add one to load each implementation's checkpoint into the others"
        )
    if not loads_into_others(cell):
        pytest.skip(DEFAULT_LOADS_NOTHING)
    loads = experiment[0].other_implementations
    loaded = [name for name, outcome in loads.items() if "problems" in outcome]
    record_property("loaded_into", ", ".join(loaded))
    ratios = [outcome["step_ratio"] for outcome in loads.values() if "step_ratio" in outcome]
    if ratios:
        record_property("step_after_load_max_ratio", f"{max(ratios):.3g}")
    not_loaded = {
        name: outcome.get("unavailable") or outcome.get("not_loaded")
        for name, outcome in loads.items()
        if name not in loaded
    }
    for name, why in not_loaded.items():
        print(f"not loaded into {name}: {why}")
    problems = {
        name: [
            f"  into {name}, rank {rank}: {line}"
            for rank, record in enumerate(experiment)
            for line in record.other_implementations[name]["problems"]
        ]
        for name in loaded
    }
    failing = [name for name, lines in problems.items() if lines]
    if failing:
        raise AssertionError(
            f"{cell.id}: the checkpoint the {implementation_of(cell)} implementation saved does not load exactly into "
            f"{', '.join(failing)} ({len(failing)} of the {len(loaded)} others built here):\n"
            + "\n".join(line for name in failing for line in problems[name])
        )
    if not loaded:
        pytest.skip(
            "no other implementation was loaded into here: "
            + "; ".join(f"{name}: {why}" for name, why in not_loaded.items())
        )


def test_each_step_matches_the_forloop_twin(cell, experiment, record_property):
    """Every optimizer step of the straight run against the factory's for-loop build stepped from the
    same parameters, gradients and state: `step` equal, parameters and moments within the bound
    derived from the operations' roundings (suites/comparison/update_bounds.py); `twin_max_ratio` records how
    close to the bound the cell came. Runs in the cells that load into the other implementations."""
    if IMPLEMENTATION_AXIS not in cell:
        pytest.skip(
            f"the matrix has no {IMPLEMENTATION_AXIS} axis: add one to compare each implementation with the for-loop's"
        )
    if not loads_into_others(cell):
        pytest.skip(
            f"{IMPLEMENTATION_AXIS}={DEFAULT_IMPLEMENTATION} is the factory's own choice of the implementations the other cells compare"
        )
    verdicts = [record.twin for record in experiment]
    if "unavailable" in verdicts[0]:
        pytest.skip(verdicts[0]["unavailable"])
    record_property("twin_max_ratio", f"{max(verdict['max_ratio'] for verdict in verdicts):.3g}")
    record_property("twin_max_abs", f"{max(verdict['max_abs'] for verdict in verdicts):.3g}")
    record_property("twin_bound", verdicts[0]["bound"])
    assert verdicts[0]["steps"], f"{cell.id}: no optimizer step was compared with the for-loop twin"
    lines = [
        f"  rank {rank}, {verdict['differences'][0]}" for rank, verdict in enumerate(verdicts) if verdict["differences"]
    ]
    if lines:
        raise AssertionError(
            f"{cell.id}: the {implementation_of(cell)} step differs from the for-loop twin's on the same parameters, "
            f"gradients and state (the first difference per rank):\n" + "\n".join(lines)
        )
