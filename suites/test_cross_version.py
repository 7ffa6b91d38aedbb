"""Checkpoints across torch versions, the writing side: each cell trains a few steps and saves
through the `checkpointer` component, next to the values the load must restore in a form no torch
version stands between (suites/checkpoints/neutral_state.py). The other versions of the run load it in the read
pass (suites/cross_version_reads.py, run by `torchmatrix cross-read`): the baseline loads each
candidate's writes (rollback) and each candidate the baseline's (forward).

The runner passes `run_dir`, `torch` (this version's pin) and `peers` (the versions that read
these writes) in the suite's options; other options are the resume suite's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from torchmatrix.testing import (
    EXPECTED_FILE,
    CrossVersionOptions,
    data_parallel_rank,
    data_parallel_size,
    load,
    writes_dir,
)

from .checkpoints.checkpointer_forms import RunCheckpointer
from .checkpoints.neutral_state import neutral
from .comparison.deterministic import deterministic_algorithms
from .training_runs.training_run import TrainingRun, write_dataset

OPTIONS = CrossVersionOptions  # the dataclass `suite_options` arrives as


def test_writes_checkpoint_for_other_versions(cell, ranks, suite_options, components, tmp_path):
    """Train to the resume step, save through the checkpointer (either form), and keep what a load
    must restore beside it, with the extra state the checkpointer's save returned."""
    if not suite_options.peers:
        pytest.skip("one torch version in this matrix: no other version reads this cell's checkpoint")
    options = suite_options
    target = writes_dir(Path(suite_options.run_dir), suite_options.torch, cell.id)
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    data_path = str(tmp_path / "tokens.pt")
    write_dataset(components, options, data_path)
    states = ranks.run(train_and_save, dict(cell), options, components, data_path, str(target / "checkpoint"))
    expected = {"torch": suite_options.torch, "step": options.resume_step, "ranks": states}
    partial = target / f".{EXPECTED_FILE}.partial"
    partial.write_text(json.dumps(expected))
    partial.replace(target / EXPECTED_FILE)  # last: a reader finds expected values only beside a whole checkpoint


def restorable(run: TrainingRun) -> dict:
    """What a load must restore, as this rank sees it: full parameters, its optimizer state,
    param groups, scheduler, the loader's next batches (across an epoch boundary) and the RNG streams."""
    snapshot = run.state_snapshot()
    return neutral({key: snapshot[key] for key in RESTORED})


RESTORED = (
    "parameters",
    "optimizer_state",
    "param_groups",
    "scheduler",
    "next_batches",
    "rng",
)  # state_snapshot's keys


def this_ranks_run(cell: dict, options: dict, components: dict, data_path: str, *, seed: int) -> TrainingRun:
    """This rank's training run of the cell from `seed`: the writing and the reading torch build it alike."""
    return TrainingRun(
        cell, options, components, data_path, data_parallel_rank(cell), data_parallel_size(cell), seed=seed
    )


def train_and_save(cell: dict, options: dict, components: dict, data_path: str, checkpoint_dir: str) -> dict:
    """Rank function: train to the resume step, save, return this rank's restorable state."""
    with deterministic_algorithms():
        run = this_ranks_run(cell, options, components, data_path, seed=options.seed)
        for _ in range(options.resume_step):
            run.train_step()
        state = restorable(run)
        checkpointer = RunCheckpointer(
            load(components["checkpointer"]), checkpoint_dir, **run.checkpointables(), cell=cell
        )
        state["extra_state"] = neutral(checkpointer.save(options.resume_step))
        return state
