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
- Options: `ResumeOptions` (torchmatrix/matrix/suite_options.py); each rank sends its `RankRecord`.
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass, field

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from torchmatrix.testing import (
    CONSEQUENCE_OF,
    DEFAULT_IMPLEMENTATION,
    IMPLEMENTATION_AXIS,
    IMPLEMENTATIONS,
    ResumeOptions,
    UnavailableCheckpointMode,
    UnavailableImplementation,
    build_optimizer,
    call_accepting,
    capture_rng_state,
    checkpointer_path,
    consequence_of,
    data_parallel_rank,
    data_parallel_size,
    implementation_of,
    load,
    restore_rng_state,
    rng_streams,
    saves_asynchronously,
    state_dict_root,
)

from .checkpoints.checkpointer_forms import RunCheckpointer, SaveInFlight
from .checkpoints.held_steps import held_state, held_step_lines
from .comparison.deterministic import deterministic_algorithms
from .comparison.ulp import bits_difference, bits_equal, ulp_distance
from .components.parallelize_component import parallelized
from .components.scheduler_component import build_scheduler, scheduler_position
from .components.stack_loader import StackLoader
from .components.training_step import build_training_step
from .references.optimizer_twin import OptimizerSteps, build_twin, compare_with_kept
from .state.built_names import named_modules_as_built, named_parameters_as_built
from .state.device_copies import on_device
from .state.optimizer_state import (
    brief,
    local_part,
    optimizer_attributes,
    optimizer_state_of,
    param_groups_of,
    plain_differences,
    plain_equal,
    quantized_keys,
    state_adapter,
)
from .state.owned_generators import generator_state, owned_generators, set_generator_state, state_bytes
from .training_runs.step_trace import digest, digests, first_divergence

OPTIONS = ResumeOptions  # the dataclass `suite_options` arrives as

try:
    import numpy
except ImportError:
    numpy = None


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


def write_dataset(components: dict, options: ResumeOptions, path: str) -> None:
    """The on-disk dataset the training runs read, the same for every run and torch version (seed 0)."""
    load(components["dataset"]).write(
        path,
        vocab_size=options.vocab_size,
        num_sequences=options.num_sequences,
        seq_len=options.seq_len,
        seed=0,
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


AFTER_LOAD_PIECES = (
    "parameters",
    "optimizer_state",
    "optimizer_state_dtype_device",
    "param_groups",
    "scheduler",
    "loader",
    "rng",
    "extra_state",
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


def parameter_mismatches(expected: dict, actual: dict) -> list[str]:
    """Per parameter: missing or not bit-identical; no parameter at all is a failure, not a pass."""
    if not expected:
        return ["  the model has no parameters on this rank: nothing to compare"]
    problems = [f"  {name}: missing after the resume" for name in sorted(expected.keys() - actual.keys())]
    return problems + [
        f"  {name}: {problem}"
        for name in sorted(expected.keys() & actual.keys())
        if (problem := bits_difference(actual[name], expected[name]))
    ]


def value_mismatch(expected, actual) -> str | None:
    """bits_difference for tensors; plain equality for the other values a state may hold."""
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        return bits_difference(actual, expected)
    return None if expected == actual else f"{actual!r}, expected {expected!r}"


def state_mismatches(expected: dict, actual: dict) -> list[str]:
    """Per parameter and state key: what is missing, extra or not bit-identical; no state at all
    is a failure, not a pass."""
    if not any(expected.values()):
        return ["  the optimizer holds no state after training on this rank: nothing to compare"]
    problems = []
    for name, expected_state in expected.items():
        actual_state = actual.get(name)
        if actual_state is None:
            problems.append(f"  {name}: no state at all (expected {sorted(expected_state)})")
            continue
        for key, value in expected_state.items():
            problem = "missing" if key not in actual_state else value_mismatch(value, actual_state[key])
            if problem:
                problems.append(f"  {name}.{key}: {problem}")
    problems += [f"  {name}: state present, none expected" for name in actual.keys() - expected.keys()]
    return problems


@dataclass
class FinalState:
    """What one run ended with on this rank: its losses, parameter shards, optimizer state and where that state lives."""

    losses: list[torch.Tensor]
    parameters: dict[str, torch.Tensor]
    optimizer_state: dict[str, dict]
    optimizer_state_dtype_device: dict[str, dict[str, tuple[str, str]]]

    @classmethod
    def of(cls, run: TrainingRun, losses: list[torch.Tensor]) -> FinalState:
        return cls(losses, run.parameters(), run.optimizer_state(), run.optimizer_state_dtype_device())


@dataclass
class RankRecord:
    """What one rank hands the tests: both runs' final state and what it found at the save and right after the load."""

    straight: FinalState
    resumed: FinalState
    after_load: dict[str, list[str]]  # piece (and `parameter_shards`) -> what differs right after the load
    other_implementations: dict[str, dict]  # implementation -> {"problems" | "unavailable" | "not_loaded": ...}
    quantized_at_save: list[str]  # `param.key` of each quantized state at the save
    rng_streams_used: list[str]  # the RNG streams training advanced
    rebuilt_equals_saved: bool  # the rebuilt model held the saved parameters before the load
    first_divergence: str | None = None  # where the straight and resumed runs first part (step, quantity), if they do
    equal_before_load: list[str] = field(default_factory=list)  # pieces a no-op load would have passed
    extra_state_saved: list[str] = field(default_factory=list)  # the keys of the checkpointer's extra state
    rng_at_save: dict[str, bytes | None] = field(default_factory=dict)  # each used stream at the save
    rng_after_load: dict[str, bytes | None] = field(default_factory=dict)  # and right after the load
    twin: dict = field(default_factory=dict)  # the for-loop twin's verdict (OptimizerSteps.verdict), where it ran
    held_steps: list[str] = field(default_factory=list)  # loaded tensors holding another step's value (held_steps.py)
    save_in_flight: str = "synchronous"  # whether the upload still ran when the optimizer stepped after the save


@dataclass
class Unavailable:
    """The cell's optimizer implementation or checkpoint mode is not available here, and why (its tests skip)."""

    reason: str


@dataclass
class SaveFailed:
    """The checkpointer's second save raised where its first had worked: nothing to load (the tests skip, but one)."""

    reason: str


def straight_and_resumed(
    cell: dict, options: ResumeOptions, components: dict, data_path: str, checkpoint_dir: str, asynchronous: bool
) -> RankRecord | Unavailable | SaveFailed:
    """Rank function: run A (N steps straight) and run B (K steps, save, rebuild, load, N - K steps)."""
    with deterministic_algorithms():
        return _straight_and_resumed(
            cell,
            options,
            components,
            data_path,
            checkpoint_dir,
            data_parallel_rank(cell),
            data_parallel_size(cell),
            asynchronous,
        )


def _straight_and_resumed(
    cell: dict,
    options: ResumeOptions,
    components: dict,
    data_path: str,
    checkpoint_dir: str,
    rank: int,
    world_size: int,
    asynchronous: bool,
) -> RankRecord | Unavailable | SaveFailed:
    steps, resume_step = options.steps, options.resume_step
    checkpointer = load(components["checkpointer"])

    try:
        run_a = TrainingRun(cell, options, components, data_path, rank, world_size, seed=options.seed)
    except UnavailableImplementation as unavailable:
        return Unavailable(str(unavailable))
    if loads_into_others(cell):
        run_a.watch_steps(keep=(resume_step + 1,), twin=True)
    straight_losses = [run_a.train_step() for _ in range(steps)]
    streams_used = sorted(run_a.rng_streams_advanced)
    # The batches the saved run reads next are the straight run's from the save on (the same seed and
    # data): read past its last step from its loader, they never move run B's, so the check does not
    # rewind the saved run through the loader's own load_state_dict, the very thing it looks at.
    straight_batches = run_a.batches + run_a.read_batches(max(0, resume_step + run_a.loader_batches - steps))
    saved_next_batches = straight_batches[resume_step : resume_step + run_a.loader_batches]

    run_b = TrainingRun(cell, options, components, data_path, rank, world_size, seed=options.seed)
    try:
        saver = RunCheckpointer(checkpointer, checkpoint_dir, **run_b.checkpointables(), cell=cell)
    except UnavailableCheckpointMode as unavailable:
        return Unavailable(str(unavailable))
    for _ in range(resume_step - 1):
        run_b.train_step()
    history = {}
    if resume_step > 1:  # a first save, so that the checkpoint loaded is the checkpointer's second
        history[resume_step - 1] = held_state(run_b.parameters(), run_b.optimizer_state())
        save_and_step(run_b, saver.start_save(resume_step - 1), asynchronous)
    else:
        run_b.train_step()
    at_save = run_b.state_snapshot(next_batches=saved_next_batches)
    quantized_at_save = sorted(
        f"{name}.{key}" for name, state in run_b.named_raw_state().items() for key in quantized_keys(state)
    )
    try:
        extra_saved, in_flight = save_and_step(run_b, saver.start_save(resume_step), asynchronous)
    except (Exception, CheckpointException) as error:
        if resume_step == 1:
            raise
        return SaveFailed(
            f"the save at step {resume_step} raised {first_line(error)}, where the same checkpointer's save at step "
            f"{resume_step - 1} had worked: it cannot save twice (a stager closed after its first use, pytorch#183413)"
        )
    saver.close()
    history[resume_step] = held_state(at_save["parameter_shards"], at_save["optimizer_state"])
    history[resume_step + 1] = held_state(run_b.parameters(), run_b.optimizer_state())

    rebuilt = TrainingRun(cell, options, components, data_path, rank, world_size, seed=options.rebuild_seed)
    saved_shards = at_save["parameter_shards"]
    rebuilt_equals_saved = all(bits_equal(p, saved_shards[n]) for n, p in rebuilt.parameters().items())
    before_load = after_load_differences(at_save, rebuilt.state_snapshot(), straight_batches, streams_used, resume_step)
    loaded_step, extra_loaded = rebuilt.load_checkpoint(checkpointer, checkpoint_dir, cell)
    if loaded_step != resume_step:
        raise AssertionError(f"checkpointer.load returned step {loaded_step}, saved at step {resume_step}")
    loaded = rebuilt.state_snapshot()
    held_steps = held_step_lines(
        history, resume_step, held_state(loaded["parameter_shards"], loaded["optimizer_state"])
    )
    after_load = after_load_differences(at_save, loaded, straight_batches, streams_used, resume_step)
    after_load["extra_state"] = extra_state_differences(extra_saved, extra_loaded)
    resumed_losses = [rebuilt.train_step() for _ in range(steps - resume_step)]
    build = (cell, options, components, data_path, rank, world_size)
    other_implementations = (
        loads_into_other_implementations(
            build, checkpoint_dir, at_save, straight_batches, streams_used, run_a.watch.kept.get(resume_step + 1)
        )
        if loads_into_others(cell)
        else {}
    )

    return RankRecord(
        straight=FinalState.of(run_a, straight_losses),
        resumed=FinalState.of(rebuilt, resumed_losses),
        after_load=after_load,
        other_implementations=other_implementations,
        twin=run_a.watch.verdict() if run_a.watch else {},
        quantized_at_save=quantized_at_save,
        rng_streams_used=streams_used,
        first_divergence=first_divergence(run_a.trace[resume_step:], rebuilt.trace, resume_step + 1),
        rebuilt_equals_saved=rebuilt_equals_saved,
        equal_before_load=[piece for piece in AFTER_LOAD_PIECES if piece in before_load and not before_load[piece]],
        extra_state_saved=sorted(map(str, extra_saved)),
        rng_at_save={name: at_save["rng"].get(name) for name in streams_used},
        rng_after_load={name: loaded["rng"].get(name) for name in streams_used},
        held_steps=held_steps,
        save_in_flight=in_flight,
    )


def save_and_step(run: TrainingRun, save: SaveInFlight, asynchronous: bool) -> tuple[dict, str]:
    """Train the step after a save: a synchronous cell awaits the save first, an asynchronous one
    (which must get a future) waits only for its staging before the optimizer steps and for its
    upload after. The extra state the save wrote, and whether its upload still ran at the step."""
    if not asynchronous:
        extra = save.result()
        run.train_step()
        return extra, "synchronous"
    if not save.is_asynchronous:
        raise AssertionError(
            f"option async_save names this cell, but {save.checkpointer}'s save returned "
            f"{type(save.returned).__name__}, no future; point [components] checkpointer_async at a checkpointer "
            "whose save returns one"
        )
    uploading = []
    run.train_step(before_optimizer_step=lambda: (save.wait_for_staging(), uploading.append(save.uploading())))
    return save.result(), "in flight" if uploading[0] else "done before the step"


KERNEL_FLAGS = ("foreach", "fused", "capturable")
"""The param-group entries by which torch's optimizers choose their kernels: not hyper-parameters, so
a load into another implementation must leave them as that implementation built them."""
CROSS_LOAD_PIECES = ("parameters", "optimizer_state", "param_groups")


DEFAULT_LOADS_NOTHING = (
    f"{IMPLEMENTATION_AXIS}={DEFAULT_IMPLEMENTATION}: the cells of the other implementations load their checkpoints "
    "into each implementation the factory builds (torch's default is its for-loop or foreach kernels, per device); "
    "loading from every default cell too would repeat them in every cell of the matrix"
)


def loads_into_others(cell) -> bool:
    """Whether this cell's checkpoint is loaded into the other implementations: where the matrix has the
    axis and the cell steps an implementation other than the default."""
    return IMPLEMENTATION_AXIS in cell and implementation_of(cell) != DEFAULT_IMPLEMENTATION


COMPILED_NOT_A_TARGET = (
    "not loaded into from another implementation's cell: DCP's load template runs one step of a fresh optimizer, "
    "which for a compiled step is a compile per cell (tens of seconds on CPU); the compiled cells load their own "
    "checkpoint and step after it"
)


def loads_into_other_implementations(
    build: tuple, checkpoint_dir: str, at_save: dict, straight_batches: list, streams_used: list[str], kept
) -> dict[str, dict]:
    """Per implementation other than the cell's own (and `default`): `{"unavailable": reason}` where
    its factory cannot build it here, `{"not_loaded": reason}` for `compiled`, else `{"problems":
    [...], "step_ratio": ...}`: what differs right after loading the cell's checkpoint into a fresh
    run of it, kernel flags the load changed, and the first step after the load: raised, or not the
    never-stopped run's step (`kept`) within the derived bound (suites/references/optimizer_twin.py)."""
    cell, options, components, data_path, rank, world_size = build
    checkpointer = load(components["checkpointer"])
    loads = {}
    for other in IMPLEMENTATIONS:
        if other in (DEFAULT_IMPLEMENTATION, implementation_of(cell)):
            continue
        if other == "compiled":
            loads[other] = {"not_loaded": COMPILED_NOT_A_TARGET}
            continue
        try:
            run = TrainingRun(*build, seed=options.rebuild_seed, implementation=other)
        except UnavailableImplementation as unavailable:
            loads[other] = {"unavailable": str(unavailable)}
            continue
        built_flags = kernel_flags(run.optimizer)
        try:
            run.load_checkpoint(checkpointer, checkpoint_dir)
        except (Exception, CheckpointException) as error:
            loads[other] = {"problems": [f"the load raised {first_line(error)}"]}
            continue
        saved, loaded = comparable_across_implementations(at_save, run.state_snapshot())
        differences = after_load_differences(saved, loaded, straight_batches, streams_used, options.resume_step)
        problems = [line for piece in CROSS_LOAD_PIECES for line in differences[piece]]
        problems += kernel_flag_changes(built_flags, kernel_flags(run.optimizer), implementation_of(cell), other)
        run.watch_steps(keep=(1,))
        try:
            run.train_step()
        except Exception as error:
            problems.append(f"the first step after the load raised {first_line(error)}")
            loads[other] = {"problems": problems}
            continue
        after_load = run.watch.kept.get(1)
        if kept is None or after_load is None:  # a step skipped (a loss scaler calibrating): nothing to compare
            loads[other] = {"problems": problems}
            continue
        sides = (f"{other} run after the load", f"{implementation_of(cell)} run that never stopped")
        check = compare_with_kept(kept, after_load, options.resume_step + 1, sides)
        problems += [f"the first step after the load: {check.difference}"] if check.difference else []
        loads[other] = {"problems": problems, "step_ratio": check.max_ratio}
    return loads


def comparable_across_implementations(saved: dict, loaded: dict) -> tuple[dict, dict]:
    """Two snapshots of different implementations, less what differs by implementation and not by
    training: the param groups' kernel flags (kernel_flag_changes judges those) and the attributes
    only one of the two optimizer objects has (fused AdamW's `_step_supports_amp_scaling`, say)."""
    common = saved["optimizer_attributes"].keys() & loaded["optimizer_attributes"].keys()

    def comparable(snapshot: dict) -> dict:
        return {
            **snapshot,
            "param_groups": [
                {key: value for key, value in group.items() if key not in KERNEL_FLAGS}
                for group in snapshot["param_groups"]
            ],
            "optimizer_attributes": {name: snapshot["optimizer_attributes"][name] for name in common},
        }

    return comparable(saved), comparable(loaded)


def kernel_flags(optimizer) -> list[dict]:
    """Per param group, the KERNEL_FLAGS it has."""
    return [{flag: group[flag] for flag in KERNEL_FLAGS if flag in group} for group in param_groups_of(optimizer)]


def kernel_flag_changes(built: list[dict], after_load: list[dict], saver: str, loader: str) -> list[str]:
    """One line per kernel flag the load changed from what the loading implementation was built with."""
    return [
        f"after load: param group {index} has {flag}={now.get(flag)!r}, built with {flag}={value!r}: the load took "
        f"the {saver} checkpoint's kernel flags, so this {loader} optimizer now runs {saver}'s kernels; put the "
        f"optimizer's own flags back after a load (a load_state_dict post-hook), or keep them out of the checkpoint"
        for index, (flags, now) in enumerate(zip(built, after_load))
        for flag, value in flags.items()
        if now.get(flag) != value
    ]


def first_line(error: BaseException) -> str:
    """`TypeName: the first line of its message`, for a failure inside a rank that the check reports
    and moves past; for DCP's CheckpointException, that of the first failing rank's own error."""
    if isinstance(error, CheckpointException) and error.failures:
        error = next(iter(error.failures.values()))[0]
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


class TrainingRun:
    """Model, optimizer, scheduler and loader built from the cell's components and one seed.

    The model is initialised from `seed` (identically on every rank); dropout then draws from
    `seed + 1 + rank` under option `seeding = "per_rank"`, so ranks mask differently, as they do in
    real data-parallel training, or from `seed + 1` on every rank under `"replicated"`. `rank` and
    `world_size` are data-parallel (torchmatrix.testing.data_parallel_rank): the ranks of a
    tensor-parallel group read the same batches and draw the same masks, as their layers' slices need.
    """

    def __init__(
        self,
        cell: dict,
        options: ResumeOptions,
        components: dict,
        data_path: str,
        rank: int,
        world_size: int,
        *,
        seed: int,
        implementation: str | None = None,
    ):
        from torchmatrix.testing import current_device

        self.device = current_device()
        param_dtype = torch.bfloat16 if cell["optimizer"] in options.bf16_param_optimizers else torch.float32
        torch.manual_seed(seed)
        model = load(components["model"])(cell, dropout=options.dropout, dtype=param_dtype)
        self.model = parallelized(components, model, cell, device=self.device)
        self.factory = load(components[f"optimizer_{cell['optimizer']}"])
        self.hyperparameters = dict(lr=options.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=options.weight_decay)
        self.implementation = implementation or implementation_of(cell)
        self.optimizer = build_optimizer(
            self.factory, self.model, **self.hyperparameters, implementation=self.implementation
        )
        self.watch: OptimizerSteps | None = None
        self.plain_state = state_adapter(components, cell["optimizer"])
        self.scheduler = build_scheduler(
            components, self.optimizer, warmup_steps=options.warmup_steps, total_steps=options.steps, cell=cell
        )
        self.training_step = build_training_step(components, model=self.model, optimizer=self.optimizer, cell=cell)
        self.batch_keywords = options.batch_keywords
        self.dataset = call_accepting(
            load(components["dataset"]), data_path, seq_len=options.seq_len, vocab_size=options.vocab_size, cell=cell
        )
        self.loader = self.dataset.loader(batch_size=options.batch_size, rank=rank, world_size=world_size)
        self.reading = StackLoader(self.loader)
        self.loader_batches = options.loader_batches or batches_past_an_epoch(options, world_size)
        dropout_seed = seed + 1 + (rank if options.seeding == "per_rank" else 0)
        torch.manual_seed(dropout_seed)
        random.seed(dropout_seed)
        if numpy is not None:
            numpy.random.seed(dropout_seed)
        self.batches: list = []
        self.trace: list[dict] = []
        self.rng_at_start = self.rng_streams()

    @property
    def generators(self) -> dict[str, object]:
        """The generators the model, dataset, loader, optimizer and scheduler own, by path (see suites/state/owned_generators.py)."""
        return owned_generators(
            {
                "model": self.model,
                "dataset": self.dataset,
                "loader": self.loader,
                "optimizer": self.optimizer,
                "scheduler": self.scheduler,
            }
        )

    def rng_streams(self) -> dict[str, bytes]:
        """The process's RNG streams and the generators this run's objects own, by name, as bytes."""
        return {**rng_streams(), **{name: state_bytes(g) for name, g in self.generators.items()}}

    @property
    def rng_streams_advanced(self) -> set[str]:
        """The RNG streams this run's steps have drawn from so far, generators created during training
        (lazily, in a first forward) included: the generators are looked for now, not only at the start."""
        now = self.rng_streams()
        return {name for name, state in now.items() if self.rng_at_start.get(name) != state}

    def train_step(self, before_optimizer_step=None) -> torch.Tensor:
        """One optimizer step; returns this rank's loss as a CPU fp32 scalar. What fed the step and
        what it made go to `trace` (suites/training_runs/step_trace.py). `before_optimizer_step` runs right before
        the optimizer steps (waiting for an asynchronous save's staging)."""
        self.model.train()
        batch = self.reading.next_batch()
        self.batches.append(on_device(batch, "cpu"))
        record = {
            "batch": {"batch": digest(self.batches[-1])},
            "lr": {
                f"param group {i} lr": digest(group["lr"]) for i, group in enumerate(param_groups_of(self.optimizer))
            },
            "non_persistent_buffers": digests(self.non_persistent_buffers()),
            "rng": self.rng_streams(),
            "parameters": digests(self.parameters()),
        }
        batch = on_device(batch, self.device)
        if self.batch_keywords and isinstance(batch, torch.Tensor):
            batch = dict.fromkeys(self.batch_keywords, batch)
        loss = self.training_step.loss(batch)
        self.training_step.backward(loss)
        record["gradients"] = {
            name: digest(local_shard(param.grad))
            for name, param in named_parameters_as_built(self.model)
            if param.grad is not None
        }
        before = self.watch.before_step() if self.watch else None
        if before_optimizer_step:
            before_optimizer_step()
        self.training_step.optimizer_step()
        if self.watch:
            self.watch.after_step(before)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        record["updated"] = digests(self.parameters())
        self.trace.append(record)
        return loss.detach().float().cpu()

    def watch_steps(self, keep: tuple[int, ...], twin: bool = False) -> None:
        """From now on keep the optimizer steps numbered `keep` (from 1), and with `twin` compare each
        step with the factory's for-loop build (suites/references/optimizer_twin.py)."""
        built = build_twin(self.factory, self.model, self.implementation, **self.hyperparameters) if twin else None
        unavailable = built if isinstance(built, str) else None
        self.watch = OptimizerSteps(self.model, self.optimizer, None if unavailable else built, keep, unavailable)

    def checkpointables(self) -> dict:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler, "loader": self.loader}

    def load_checkpoint(self, checkpointer, directory: str, cell: dict | None = None) -> tuple[int, dict]:
        """Load `directory` through the `checkpointer` component into this run, then read the loader
        anew from where its own load put it (StackLoader.reopen); the step and extra state loaded."""
        loaded = RunCheckpointer(checkpointer, directory, **self.checkpointables(), cell=cell).load()
        self.reading.reopen()
        return loaded

    def read_batches(self, count: int) -> list:
        """The next `count` batches, on the CPU, read as training reads them (the run moves on)."""
        return [on_device(self.reading.next_batch(), "cpu") for _ in range(count)]

    def parameters(self) -> dict[str, torch.Tensor]:
        """This rank's shard of every parameter, by the model's own name, copied to the CPU."""
        return {name: local_shard(param) for name, param in named_parameters_as_built(self.model)}

    def non_persistent_buffers(self) -> dict[str, torch.Tensor]:
        """This rank's copy of every buffer the model keeps out of its state dict (`persistent=False`:
        a curriculum step, a running statistic), by name, on the CPU: a checkpoint of the state
        dict leaves them as a fresh build has them."""
        return {
            f"{name}.{buffer_name}" if name else buffer_name: local_shard(module._buffers[buffer_name])
            for name, module in named_modules_as_built(self.model)
            for buffer_name in sorted(module._non_persistent_buffers_set)
            if module._buffers.get(buffer_name) is not None
        }

    def named_raw_state(self) -> dict[str, dict]:
        """The optimizer's state by parameter name, as the optimizer holds it."""
        names = {id(param): name for name, param in named_parameters_as_built(self.model)}
        return {names[id(param)]: state for param, state in optimizer_state_of(self.optimizer).items()}

    def optimizer_state(self) -> dict[str, dict]:
        """This rank's shard of every optimizer state value, by parameter name, as the state adapter
        makes it plain, copied to the CPU."""
        return {
            name: {
                key: value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else value
                for key, value in self.plain_state(state).items()
            }
            for name, state in self.named_raw_state().items()
        }

    def optimizer_state_dtype_device(self) -> dict[str, dict[str, tuple[str, str]]]:
        """Per parameter name and state key, the dtype and device of each state tensor as the
        optimizer holds it (a DTensor's local shard's device), before any state adapter or copy."""
        return {
            name: {
                key: (str(value.dtype), str(local_part(value).device))
                for key, value in state.items()
                if isinstance(value, torch.Tensor)
            }
            for name, state in self.named_raw_state().items()
        }

    def state_snapshot(self, next_batches: list | None = None) -> dict:
        """Every piece a resume must restore, as this rank sees it now (a collective: full parameters);
        `next_batches`, where given, stands for the loader's look-ahead (see _straight_and_resumed)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(state_dict_root(self.model), options=StateDictOptions(full_state_dict=True))
        return {
            "parameters": {name: value.detach().to("cpu", copy=True) for name, value in full.items()},
            "parameter_shards": self.parameters(),
            "optimizer_state": self.optimizer_state(),
            "optimizer_state_dtype_device": self.optimizer_state_dtype_device(),
            "param_groups": [
                {key: copied(value) for key, value in group.items() if key != "params"}
                for group in param_groups_of(self.optimizer)
            ],
            "optimizer_attributes": optimizer_attributes(
                self.optimizer, {id(param): name for name, param in named_parameters_as_built(self.model)}
            ),
            "scheduler": scheduler_position(self.scheduler),
            "next_batches": self.peek_next_batches() if next_batches is None else next_batches,
            "rng": self.rng_streams(),
        }

    def peek_next_batches(self) -> list[torch.Tensor]:
        """The `loader_batches` batches the loader yields next (StackLoader.batches_ahead); RNG streams
        and the generators the run owns are put back too, in case the loader draws from them."""
        generators = capture_rng_state()
        owned = {name: (g, copy.deepcopy(generator_state(g))) for name, g in self.generators.items()}
        batches = self.reading.batches_ahead(self.loader_batches, self.dataset)
        restore_rng_state(generators)
        for generator, state in owned.values():
            set_generator_state(generator, state)
        return batches


def copied(value):
    """A tensor cloned (a param group's tensor LR is updated in place by the scheduler); anything else as it is."""
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a state tensor on the CPU, dequantized when it is a tensor subclass
    that stores something else than its values (a float8 tensor of TransformerEngine, say)."""
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    if type(local) not in (torch.Tensor, torch.nn.Parameter) and hasattr(local, "dequantize"):
        local = local.dequantize()
    return local.detach().to("cpu", copy=True)


def after_load_differences(
    saved: dict, loaded: dict, straight_batches: list, rng_used: list[str], resume_step: int
) -> dict:
    """Per piece of state, one line for each thing that differs between save and right after load."""
    return {
        "parameters": tensor_differences("parameter", saved["parameters"], loaded["parameters"]),
        "parameter_shards": tensor_differences(
            "parameter shard", saved["parameter_shards"], loaded["parameter_shards"]
        ),
        "optimizer_state": optimizer_state_differences(saved["optimizer_state"], loaded["optimizer_state"])
        + optimizer_attribute_differences(saved["optimizer_attributes"], loaded["optimizer_attributes"]),
        "optimizer_state_dtype_device": dtype_device_differences(
            saved["optimizer_state_dtype_device"], loaded["optimizer_state_dtype_device"]
        ),
        "param_groups": param_group_differences(saved["param_groups"], loaded["param_groups"]),
        "scheduler": [
            f"after load: scheduler {key} is {loaded['scheduler'][key]!r}, saved {value!r}"
            for key, value in saved["scheduler"].items()
            if loaded["scheduler"][key] != value
        ],
        "loader": loader_differences(saved["next_batches"], loaded["next_batches"], straight_batches, resume_step),
        "rng": [
            f"after load: RNG stream {name} differs from the saved one"
            if name in loaded["rng"]
            else f"after load: RNG stream {name} does not exist: the saved run created it during training, and no load restored it"
            for name in rng_used
            if loaded["rng"].get(name) != saved["rng"].get(name)
        ],
    }


def difference(expected, actual) -> str | None:
    """None when bit-identical, else a short reason: dtype, shape, or the largest difference."""
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        return None if expected == actual else f"is {actual!r}, saved {expected!r}"
    return bits_difference(actual, expected, reference="saved")


def tensor_differences(what: str, saved: dict, loaded: dict) -> list[str]:
    if not saved:
        return [f"after load: no {what} to compare: the model's state dict is empty"]
    problems = [f"after load: {what} {name} missing" for name in saved.keys() - loaded.keys()]
    return problems + [
        f"after load: {what} {name} {reason}"
        for name in sorted(saved.keys() & loaded.keys())
        if (reason := difference(saved[name], loaded[name]))
    ]


def optimizer_state_differences(saved: dict, loaded: dict) -> list[str]:
    if not any(saved.values()):
        return ["after load: the optimizer had no state at the checkpoint step: nothing to compare"]
    problems = []
    for name, saved_state in sorted(saved.items()):
        loaded_state = loaded.get(name, {})
        for key, value in saved_state.items():
            reason = "missing" if key not in loaded_state else difference(value, loaded_state[key])
            if reason:
                problems.append(f"after load: optimizer state {key} of {name} {reason}")
    return problems + [
        f"after load: optimizer state of {name} present, none saved" for name in loaded.keys() - saved.keys()
    ]


def dtype_device_differences(saved: dict, loaded: dict) -> list[str]:
    """Per parameter and state key, the dtype or device the optimizer holds a state tensor in right
    after the load, where it is not the one saved: a load (or a compiled step's handling of it) that
    casts `step` or moves it to another device (pytorch#173901)."""
    if not any(saved.values()):
        return ["after load: the optimizer had no state at the checkpoint step: nothing to compare"]
    return [
        f"after load: optimizer state {key} of {name} is "
        + (
            f"{now[0]} on {now[1]}, saved {kept[0]} on {kept[1]}"
            if (now := loaded.get(name, {}).get(key))
            else "missing"
        )
        for name, state in sorted(saved.items())
        for key, kept in state.items()
        if loaded.get(name, {}).get(key) != kept
    ]


def dtype_device_mismatches(expected: dict, actual: dict) -> list[str]:
    """dtype_device_differences for the final state: straight run (expected) vs resumed (actual)."""
    return [
        f"  {name}.{key}: {now[0]} on {now[1]}, expected {kept[0]} on {kept[1]}"
        for name, state in sorted(expected.items())
        for key, kept in state.items()
        if (now := actual.get(name, {}).get(key)) and now != kept
    ]


def extra_state_differences(saved: dict, loaded: dict) -> list[str]:
    """Per key of the extra state the checkpointer's save returned: missing from what its load
    returned, or different (a `tokens_seen` a manager writes and then loses)."""
    return [
        f"after load: extra state {key!r} " + ("missing from what load returned" if key not in loaded else reason)
        for key in sorted(saved, key=str)
        if key not in loaded or (reason := difference(saved[key], loaded[key]))
    ]


def param_group_differences(saved: list[dict], loaded: list[dict]) -> list[str]:
    if not saved:
        return ["after load: the optimizer had no param groups at the checkpoint step: nothing to compare"]
    if len(saved) != len(loaded):
        return [f"after load: {len(loaded)} param groups, saved {len(saved)}"]
    return [
        f"after load: param group {index} {key} {reason}"
        for index, (saved_group, loaded_group) in enumerate(zip(saved, loaded))
        for key in sorted(saved_group.keys() | loaded_group.keys())
        if (reason := difference(saved_group.get(key), loaded_group.get(key)))
    ]


def loader_differences(saved: list, loaded: list, straight_batches: list, resume_step: int) -> list[str]:
    """The first of the next batches that differs after load vs at save, each named by its index in
    the straight run's reading order: the next one, or one further on (past an epoch boundary)."""
    differing = next((i for i, (a, b) in enumerate(zip(loaded, saved)) if not plain_equal(a, b)), None)
    if differing is None:
        return []

    def index(batch) -> str:
        found = [i for i, seen in enumerate(straight_batches) if plain_equal(batch, seen)]
        return f"batch {found[0]}" if found else "a batch the straight run never read"

    if differing == 0:
        return [f"after load: loader would yield {index(loaded[0])}, saved at {index(saved[0])}"]
    return [
        f"after load: the loader's batch {resume_step + differing} (the {ordinal(differing + 1)} after the load) "
        f"differs from the saved loader's, though the {differing} before it agree: the order changes later "
        f"(at an epoch boundary?), so something the order depends on (epoch, shuffle seed) was not restored"
    ]


def ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def batches_past_an_epoch(options: ResumeOptions, world_size: int) -> int:
    """How many batches to compare after the load so that they cross an epoch boundary wherever the
    resume falls: one epoch's worth of this world size's global batches, and one more."""
    return math.ceil(options.num_sequences / (options.batch_size * world_size)) + 1


def optimizer_attribute_differences(saved: dict, loaded: dict) -> list[str]:
    """The optimizer object's own counters, scalars and tables (besides `.state` and `.param_groups`)
    by attribute name and content: a `{param: flag}` table compares by parameter names."""
    lines = [
        f"after load: optimizer attribute {name} missing, saved {brief(saved[name])}"
        for name in saved.keys() - loaded.keys()
    ]
    lines += [
        f"after load: optimizer attribute {name} is {brief(loaded[name])}, saved nothing"
        for name in loaded.keys() - saved.keys()
    ]
    for name in saved.keys() & loaded.keys():
        lines += [
            f"after load: optimizer attribute {line}" for line in plain_differences(name, saved[name], loaded[name])
        ]
    return sorted(lines)
