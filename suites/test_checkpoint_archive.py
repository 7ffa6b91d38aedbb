"""The checkpoint archive, read by the candidate: every checkpoint an older (or newer) release wrote
(`torchmatrix archive write`, suites/checkpoints/archive_writer.py) loads, and training continues from it
exactly as it continues from the same values set without any checkpoint format.

One test per archived release and form, named like `2.15.0/fsdp2-tp/fused/async`, in a world of
the form's own size (`ranks.in_world`):

1. the load restores every value the writer recorded, bit for bit, else a *format difference*
   naming the value;
2. CONTINUE_STEPS steps from the load equal CONTINUE_STEPS steps from the recorded values set
   directly (the candidate's run that never stopped), else a *resume difference* naming the tensor;
3. that continuation is compared with the writer's own: bit-equal is exact across the pair; a
   difference is a *numerics difference* (kernels change between releases), which passes and is
   recorded as the `archive_continuation` property and an ArchiveNumericsDifference warning, so
   the report and the upgrade diff show it without reading it as a break.

Keys the candidate's state has and the checkpoint lacks (a field a later release added to the
scheduler's state_dict, say) are loaded around, not refused: check 1 still compares every value
the writer recorded, and the keys are kept as the `archive_checkpoint_lacks` property and an
ArchiveCheckpointLacksKeys warning (a strict `dcp.load` refuses such a checkpoint).
A form the release could not write is collected and skipped with the writer's reason.
"""

from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path

import pytest
import torch

from torchmatrix.testing import CheckpointArchiveOptions, planned_options, root_cause

from .checkpoints.archive_stack import CONTINUE_STEPS, FORMS, Stack
from .checkpoints.archive_writer import EXPECTED_FILE, MANIFEST_FILE
from .checkpoints.neutral_state import decoded, neutral
from .comparison.differences import state_differences

OPTIONS = CheckpointArchiveOptions  # the dataclass `suite_options` arrives as

SHIPPED_ARCHIVE = Path(__file__).resolve().parent.parent / "archive" / "checkpoints"
"""The archive of this torchmatrix's checkout, read when the options name no other."""
REBUILD_SEED = 4321
"""The candidate builds its stacks from another seed than the writer's, so a value the load
leaves alone differs."""


class ArchiveNumericsDifference(UserWarning):
    """The candidate continued from an archived checkpoint exactly as from its values, but not as
    the writing release continued: a change of numerics between the two releases, not a break."""


class ArchiveCheckpointLacksKeys(UserWarning):
    """The candidate's state_dict has keys an older release's checkpoint lacks (a field added since):
    every recorded value still loads, but only a partial load gets there."""


def archive_dir(archive: str, rootpath: Path) -> Path:
    return rootpath / archive if archive else SHIPPED_ARCHIVE


@functools.cache
def archive_entries(directory: Path, writers: tuple[str, ...]) -> dict[str, str | None]:
    """`release/form` -> why the release did not write it (None: written), for every release's manifest."""
    entries = {}
    for manifest_path in sorted(directory.glob(f"*/{MANIFEST_FILE}"), key=lambda path: release_key(path.parent.name)):
        manifest = json.loads(manifest_path.read_text())
        if writers and manifest["torch"] not in writers:
            continue
        outcomes = {**dict.fromkeys(manifest["written"]), **manifest["not_written"]}
        entries.update(
            {f"{manifest['torch']}/{form.name}": outcomes[form.name] for form in FORMS if form.name in outcomes}
        )
    return entries


def release_key(name: str) -> tuple:
    return tuple(int(part) if part.isdigit() else part for part in name.split("."))


def pytest_generate_tests(metafunc):
    """One test per archived release and form, named `release/layout/implementation/save`."""
    if "archived" in metafunc.fixturenames:
        options = planned_options(metafunc.config, metafunc.definition.path)
        directory = archive_dir(options.archive, metafunc.config.rootpath)
        metafunc.parametrize("archived", list(archive_entries(directory, options.writers)) or ["none"])


def test_loads_and_continues(cell, ranks, suite_options, archived, request, record_property):
    """Load the archived checkpoint, compare what it restores, continue, compare the continuation."""
    directory = archive_dir(suite_options.archive, request.config.rootpath)
    if archived == "none":
        pytest.skip(f"no archive in {directory}: write one with `torchmatrix archive write`")
    writer, _, form_name = archived.partition("/")
    if not_written := archive_entries(directory, (writer,))[archived]:
        pytest.skip(f"torch {writer} did not write {form_name}: {not_written}")
    form = next(form for form in FORMS if form.name == form_name)
    source = directory / writer / form.directory
    expected = json.loads((source / EXPECTED_FILE).read_text())
    read = ranks.in_world(form.world_size).run(read_on_rank, form_name, str(source / "checkpoint"), expected)
    pair = f"{writer}/{form_name} (torch {expected['version']}, {expected['git_version'][:12]}) read by torch {torch.__version__}"
    kind, message = verdict(expected, read, pair)
    if kind in (FORMAT, RESUME):
        raise AssertionError(message)
    record_property("archive_continuation", message)
    if lacking := read[0]["lacking"]:
        record_property("archive_checkpoint_lacks", ", ".join(lacking))
        warnings.warn(
            ArchiveCheckpointLacksKeys(
                f"{pair}: the checkpoint lacks keys this release's state_dict has, so DCP's default (strict) "
                f"load refuses it; loaded with allow_partial_load: {', '.join(lacking)}"
            ),
            stacklevel=1,
        )
    if kind == NUMERICS:
        warnings.warn(ArchiveNumericsDifference(message), stacklevel=1)


FORMAT, RESUME, NUMERICS, EXACT = "format difference", "resume difference", "numerics difference", "exact"


def verdict(expected: dict, read: list[dict], pair: str) -> tuple[str, str]:
    """What the ranks' reads of one archived checkpoint found, and the message that says so: a format
    difference (the load restored other values), a resume difference (continuing from the load is
    not continuing from the values), a numerics difference (the writer continued otherwise) or exact."""

    def lines(expected_of, actual_of, reference: str) -> list[str]:
        return [
            f"rank {rank}: {line}"
            for rank, result in enumerate(read)
            for line in state_differences(decoded(actual_of(result)), decoded(expected_of(rank, result)), "", reference)
        ]

    if failed := next((result["load_failed"] for result in read if "load_failed" in result), None):
        return FORMAT, f"{FORMAT}: {pair}: the load failed: {failed}"
    if found := lines(lambda rank, _: restored_on(expected, rank), lambda result: result["loaded"], "saved"):
        return FORMAT, f"{FORMAT}: {pair}: the load restored other values:\n  " + "\n  ".join(found)
    if found := lines(lambda _, result: result["never_stopped"], lambda result: result["continued"], "never stopped"):
        return RESUME, (
            f"{RESUME}: {pair}: {CONTINUE_STEPS} steps from the load differ from {CONTINUE_STEPS} steps from "
            "the same values set directly:\n  " + "\n  ".join(found)
        )
    if found := lines(lambda rank, _: continued_on(expected, rank), lambda result: result["continued"], "the writer's"):
        return NUMERICS, f"{NUMERICS}: {pair}: the continuation differs from the writer's: " + "; ".join(found)
    return EXACT, EXACT


def restored_on(expected: dict, rank: int) -> dict:
    """What the load must restore on `rank`: the shared state and the rank's own position and RNG."""
    return {**expected["restored"], "rank": expected["ranks"][rank]["restored"]}


def continued_on(expected: dict, rank: int) -> dict:
    return {**expected["continued"], "losses": expected["ranks"][rank]["losses"]}


def read_on_rank(form_name: str, checkpoint: str, expected: dict) -> dict:
    """Rank function: load and continue, and continue from the recorded values set directly."""
    import torch.distributed as dist

    form = next(form for form in FORMS if form.name == form_name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        loaded = Stack(form, REBUILD_SEED)
        try:
            lacking = loaded.load(checkpoint)
        except Exception as error:  # DCP raises on every rank alike (CheckpointException gathers them)
            return {"load_failed": root_cause(error)}
        state = loaded.capture()
        continued = continuation(loaded)
        twin = Stack(form, REBUILD_SEED + 1)
        twin.restore(decoded(restored_on(expected, dist.get_rank())))
        never_stopped = continuation(twin)
    return {"loaded": neutral(state), "continued": continued, "never_stopped": never_stopped, "lacking": lacking}


def continuation(stack: Stack) -> dict:
    losses = torch.stack([stack.train_step() for _ in range(CONTINUE_STEPS)])
    state = stack.capture()
    state.pop("rank")
    return neutral({**state, "losses": losses})
