"""A cell's checkpoint loaded into each other optimizer implementation its factory builds (axis
`optimizer_impl`): right after the load every piece equals what was saved, the loading optimizer
keeps its own kernels, and its first step is the never-stopped run's within the derived bound."""

from __future__ import annotations

from torch.distributed.checkpoint.api import CheckpointException

from torchmatrix.testing import (
    DEFAULT_IMPLEMENTATION,
    IMPLEMENTATION_AXIS,
    IMPLEMENTATIONS,
    UnavailableImplementation,
    implementation_of,
    load,
)

from ..references.optimizer_twin import compare_with_kept
from ..state.optimizer_state import param_groups_of
from .restored_state import after_load_differences
from .training_run import TrainingRun

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
