"""resume's rank function: run A trains N steps straight; run B trains K, saves twice, rebuilds from
another seed, loads and trains N - K; each rank hands the tests a `RankRecord` of what it found."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.distributed.checkpoint.api import CheckpointException

from torchmatrix.testing import (
    ResumeOptions,
    UnavailableCheckpointMode,
    UnavailableImplementation,
    bits_equal,
    data_parallel_rank,
    data_parallel_size,
    load,
)

from ..checkpoints.checkpointer_forms import RunCheckpointer, SaveInFlight
from ..checkpoints.held_steps import held_state, held_step_lines
from ..comparison.deterministic import deterministic_algorithms
from ..state.optimizer_state import quantized_keys
from .implementation_loads import first_line, loads_into_other_implementations, loads_into_others
from .restored_state import AFTER_LOAD_PIECES, after_load_differences, extra_state_differences
from .step_trace import first_divergence
from .training_run import TrainingRun


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
