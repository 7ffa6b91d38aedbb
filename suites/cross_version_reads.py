"""Checkpoints across torch versions, the reading side, run by `torchmatrix cross-read` only (no
`test_` prefix: no matrix suite or directory collection picks it up): load, through the `checkpointer` component, what another torch version of the
run wrote for this cell (suites/test_cross_version.py), into a model, optimizer, scheduler and loader
rebuilt from another seed, and compare every restored value, the step and the extra state the
checkpointer's save returned exactly with what that version saved. A version whose writes for the cell are missing is reported as not checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchmatrix.testing import (
    EXPECTED_FILE,
    CrossVersionOptions,
    load,
    planned_options,
    writes_dir,
)

from .checkpoints.checkpoint_pickles import unsafe_globals
from .checkpoints.neutral_state import decoded, neutral
from .comparison.deterministic import deterministic_algorithms
from .comparison.differences import state_differences
from .test_cross_version import restorable, this_ranks_run
from .training_runs.training_run import write_dataset

OPTIONS = CrossVersionOptions  # the dataclass `suite_options` arrives as

NOT_CHECKED = "not checked: torch {writer} wrote no checkpoint for this cell in {run_dir} (its run has not finished it, or ran other cells)"


def pytest_generate_tests(metafunc):
    """One test per version whose writes this version reads (the plugin's plan names them)."""
    if "writer" in metafunc.fixturenames:
        metafunc.parametrize("writer", list(planned_options(metafunc.config, metafunc.definition.path).peers))


def test_loads_checkpoint_written_by(cell, ranks, suite_options, components, tmp_path, writer):
    """The other version's checkpoint of this cell loads, and every value equals what it saved."""
    options = suite_options
    source = writes_dir(Path(suite_options.run_dir), writer, cell.id)
    if not (source / EXPECTED_FILE).is_file():
        pytest.skip(NOT_CHECKED.format(writer=writer, run_dir=suite_options.run_dir))
    own_packages = frozenset(path.partition(":")[0].partition(".")[0] for path in components.values())
    own_packages |= frozenset(options.checkpoint_classes_from)
    if unsafe := unsafe_globals(source / "checkpoint", own_packages):
        pytest.fail(not_loaded(cell.id, writer, unsafe), pytrace=False)
    expected = json.loads((source / EXPECTED_FILE).read_text())
    data_path = str(tmp_path / "tokens.pt")
    write_dataset(components, options, data_path)
    loaded = ranks.run(load_and_capture, dict(cell), options, components, data_path, str(source / "checkpoint"))
    assert len(loaded) == len(expected["ranks"]), (
        f"{cell.id}: torch {writer} saved {len(expected['ranks'])} ranks, this cell has {len(loaded)}"
    )
    problems = [
        f"  rank {rank}: step {step} after the load, saved {expected['step']}"
        for rank, (step, _) in enumerate(loaded)
        if step != expected["step"]
    ]
    for rank, ((_, state), saved) in enumerate(zip(loaded, expected["ranks"])):
        returned = state.pop("extra_state")  # only the keys its save returned must come back
        state["extra_state"] = {key: value for key, value in returned.items() if key in saved.get("extra_state", {})}
        problems += [
            f"  rank {rank}: {line}" for line in state_differences(decoded(state), decoded(saved), reference="saved")
        ]
    if problems:
        raise AssertionError(
            f"{cell.id}: checkpoint written by torch {writer}, loaded by torch {suite_options.torch}, differs from what was saved:\n"
            + "\n".join(problems)
        )


def not_loaded(cell_id: str, writer: str, unsafe: dict[str, list[str]]) -> str:
    """The one-line refusal to load a checkpoint whose pickles would import more than data."""
    found = "; ".join(f"{where}: {', '.join(names)}" for where, names in unsafe.items())
    return (
        f"{cell_id}: not loaded: the checkpoint torch {writer} wrote would import code, not data, when unpickled "
        f"({found}); a checkpoint from elsewhere can run anything on load: if this run directory is yours and "
        "the globals are classes of a package you trust, name its top package in [suites.cross_version.options] "
        "checkpoint_classes_from"
    )


def load_and_capture(cell: dict, options: dict, components: dict, data_path: str, checkpoint_dir: str) -> tuple:
    """Rank function: rebuild from another seed, load the checkpoint, return (step, restorable state)."""
    with deterministic_algorithms():
        run = this_ranks_run(cell, options, components, data_path, seed=options.rebuild_seed)
        step, extra = run.load_checkpoint(load(components["checkpointer"]), checkpoint_dir, cell)
        return step, {**restorable(run), "extra_state": neutral(extra)}
