"""The resume suite is only worth running if it fails on the bugs it exists for: run it through
the real CLI on CPU, once with the reference components (every cell passes, `loss_max_ulp`
recorded as 0) and once per mutant of models/mutants/resume.py: every applicable cell fails,
each mutant with its own named message from the right-after-load check of the piece it lost,
and none errors out.

Cells: world size 1 without FSDP and world size 2 with FSDP1 and FSDP2, adamw; the reference
also with precision_aware, which the cast-on-load mutant needs. The mutants that lose the RNG,
the scheduler or the loader position skip FSDP1 (see PIECE_FSDP). The rank-0-only mutant, the one
whose symptom depends on the world size, also runs at world size 4 (two more cells; the others
would add two cells each to every run for little: what they lose is the same on every rank).
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
from junitparser import JUnitXml

from helpers.matrix_files import REFERENCE_COMPONENTS, matrix_toml
from helpers.run_results import cell_failures, run_suites

pytestmark = pytest.mark.slow

BOTH_OPTIMIZERS = ("adamw", "precision_aware")
CELL_PREFIXES = ("ws1-none", "ws2-fsdp1", "ws2-fsdp2")
# A checkpointer that loses the RNG, scheduler or loader position loses it in the base class's
# restore, which never sees how the parameters are sharded: one cell at world size 1 and one FSDP
# kind at world size 2 (the ranks' own loader positions and streams) prove it; the reference still
# runs every cell, and the mutants of sharded state (optimizer state, param groups) keep FSDP1 too.
PIECE_FSDP = ("fsdp2",)
PIECE_CELL_PREFIXES = ("ws1-none", "ws2-fsdp2")
LOSSES = "test_losses_identical_after_resume"
PARAMETERS = "test_final_parameters_identical"
STATE = "test_final_optimizer_state_identical"
PARTIAL_RESTORE = "across ranks: after load:"
NO_EXTRA_STATE = (
    "test_state_restored_right_after_load[piece=extra_state]"  # skips: these checkpointers' save returns none
)
NO_IMPLEMENTATIONS = "test_checkpoint_loads_into_other_implementations"  # skips: no optimizer_impl axis here
SKIPPING_HERE = (NO_EXTRA_STATE, NO_IMPLEMENTATIONS)


def after_load(piece: str) -> str:
    return f"test_state_restored_right_after_load[piece={piece}]"


class Mutant(NamedTuple):
    """Component overrides, the optimizers and world sizes to run, the cells (by prefix) where it
    must fail, and per test that must fail there the texts its failure says ({other_ranks}: the
    cell's ranks but 0); the fsdp values of its cells beyond world size 1."""

    overrides: dict[str, str]
    optimizers: tuple[str, ...]
    failing: tuple[str, ...]
    must_fail: dict[str, tuple[str, ...]]
    world_sizes: tuple[int, ...] = (1, 2)
    wide_fsdp: tuple[str, ...] = ("fsdp1", "fsdp2")


MUTANTS = {
    "raw_optimizer_state_dict": Mutant(
        {"checkpointer": "torchmatrix.models.mutants.resume:RawOptimizerStateCheckpointer"},
        ("adamw",),
        CELL_PREFIXES,
        {
            after_load("optimizer_state"): ("after load: optimizer state exp_avg of ",),
            LOSSES: (
                "loss at step",
                "with equal gradients and learning rate, the optimizer's update differs",
            ),
        },
    ),
    "rng_not_restored": Mutant(
        {"checkpointer": "torchmatrix.models.mutants.resume:RngNotRestoredCheckpointer"},
        ("adamw",),
        PIECE_CELL_PREFIXES,
        {
            after_load("rng"): ("after load: RNG stream torch CPU differs from the saved one",),
            LOSSES: ("loss at step",),
        },
        wide_fsdp=PIECE_FSDP,
    ),
    "scheduler_not_restored": Mutant(
        {"checkpointer": "torchmatrix.models.mutants.resume:SchedulerNotRestoredCheckpointer"},
        ("adamw",),
        PIECE_CELL_PREFIXES,
        {after_load("scheduler"): ("after load: scheduler last_epoch is 0, saved 3",), LOSSES: ("loss at step",)},
        wide_fsdp=PIECE_FSDP,
    ),
    "scheduler_one_step_late": Mutant(
        {"checkpointer": "torchmatrix.models.mutants.resume:SchedulerOneStepLateCheckpointer"},
        ("adamw",),
        PIECE_CELL_PREFIXES,
        {
            after_load("scheduler"): (
                "after load: scheduler last_epoch is 4, saved 3",
                "after load: scheduler current LR is [0.00833",
            ),
            after_load("param_groups"): ("after load: param group 0 lr is 0.00833",),
            LOSSES: ("loss at step",),
        },
        wide_fsdp=PIECE_FSDP,
    ),
    "param_groups_not_restored": Mutant(
        {"checkpointer": "torchmatrix.models.mutants.resume:ParamGroupsNotRestoredCheckpointer"},
        ("adamw",),
        CELL_PREFIXES,
        {after_load("param_groups"): ("after load: param group 0 lr is 0.00166",), LOSSES: ("loss at step",)},
    ),
    "data_position_not_restored": Mutant(
        {"checkpointer": "torchmatrix.models.mutants.resume:DataPositionNotRestoredCheckpointer"},
        ("adamw",),
        PIECE_CELL_PREFIXES,
        {
            after_load("loader"): ("after load: loader would yield batch 0, saved at batch 3",),
            LOSSES: ("loss at step",),
        },
        wide_fsdp=PIECE_FSDP,
    ),
    "loader_one_batch_late": Mutant(
        {"checkpointer": "torchmatrix.models.mutants.resume:LoaderOneBatchLateCheckpointer"},
        ("adamw",),
        PIECE_CELL_PREFIXES,
        {
            after_load("loader"): ("after load: loader would yield batch 4, saved at batch 3",),
            LOSSES: ("loss at step",),
        },
        wide_fsdp=PIECE_FSDP,
    ),
    "rank_zero_only": Mutant(
        {"checkpointer": "torchmatrix.models.mutants.resume:RankZeroOnlyCheckpointer"},
        ("adamw",),
        ("ws2-fsdp1", "ws2-fsdp2", "ws4-fsdp1", "ws4-fsdp2"),
        {
            after_load("parameters"): (
                f"{PARTIAL_RESTORE} parameters restored on rank 0 only: ranks {{other_ranks}} differ in their own shards",
                "rank 1: after load: parameter ",
            ),
            after_load("optimizer_state"): (
                f"{PARTIAL_RESTORE} optimizer state restored on rank 0 only: ranks {{other_ranks}} differ",
                "rank 1: after load: optimizer state ",
            ),
        },
        world_sizes=(1, 2, 4),
    ),
    # Pieces of state outside what the suite compared before, lost at once in one run of three
    # cells: generators the model owns (one made in the first forward), one the optimizer owns, a
    # non-persistent buffer (named where the runs part), a counter and a per-param table on the optimizer object (beside a routing
    # table a fresh build reproduces, which must not be flagged), and the shuffle seed of a
    # loader whose order changes only at the next epoch boundary (33 batches on at ws1, 17 at ws2:
    # the default `loader_batches` reaches it; the losses, six steps long, never do).
    "owned_state_not_saved": Mutant(
        {
            "model": "torchmatrix.models.mutants.resume:own_generator_dropout_model",
            "dataset": "torchmatrix.models.mutants.resume:ReshufflingTokenDataset",
            "optimizer_step_counting": "torchmatrix.models.mutants.resume:build_step_counting_precision_aware",
        },
        ("step_counting",),
        CELL_PREFIXES,
        {
            after_load("rng"): (
                "rank 0: after load: RNG stream model.prefix_layers.0.dropout.generator differs from the saved one",
                "rank 0: after load: RNG stream model.expert_layers.0.dropout.generator does not exist",
                "rank 0: after load: RNG stream optimizer.rounding_generator differs from the saved one",
            ),
            after_load("optimizer_state"): (
                "rank 0: after load: optimizer attribute steps_taken is 1, saved 3",
                "rank 0: after load: optimizer attribute updates_per_param[<param ",
            ),
            after_load("loader"): (
                "rank 0: after load: the loader's batch {epoch_start} (the {ordinal} after the load) differs from "
                "the saved loader's",
            ),
            LOSSES: (
                "loss at step",
                "the runs first part at step 4, in the gradients (",
                "the model's non-persistent buffers (in no state dict): curriculum_step, tokens_seen",
            ),
        },
    ),
    "precision_aware_cast_on_load": Mutant(
        {"optimizer_precision_aware": "torchmatrix.models.mutants.resume:build_cast_on_load_precision_aware"},
        ("precision_aware",),
        CELL_PREFIXES,
        {after_load("optimizer_state"): ("is torch.bfloat16, saved torch.float32",), LOSSES: ("loss at step",)},
    ),
}


def resume_matrix(
    components: dict[str, str],
    optimizers: tuple[str, ...],
    world_sizes: tuple[int, ...],
    wide_fsdp: tuple[str, ...] = ("fsdp1", "fsdp2"),
) -> str:
    """ws1 without FSDP and every wider world size with each of `wide_fsdp`, for the given optimizers, with these components."""
    wider = [size for size in world_sizes if size > 1]
    return matrix_toml(
        axes={
            "world_size": list(world_sizes),
            "fsdp": ["none", *wide_fsdp],
            "attn": ["sdpa"],
            "optimizer": list(optimizers),
        },
        exclude=[{"fsdp": "none", "world_size": wider}, {"fsdp": list(wide_fsdp), "world_size": 1}],
        suites={
            "resume": {
                "timeout": 240,
                "axes": ["world_size", "fsdp", "optimizer"],
                "options": {"steps": 6, "resume_step": 3},
            }
        },
        components=components,
    )


def expected_cells(
    world_sizes: tuple[int, ...], optimizers: tuple[str, ...], wide_fsdp: tuple[str, ...] = ("fsdp1", "fsdp2")
) -> set[str]:
    prefixes = [f"ws{size}-{fsdp}" for size in world_sizes for fsdp in (("none",) if size == 1 else wide_fsdp)]
    return {f"{prefix}-sdpa-{optimizer}" for prefix in prefixes for optimizer in optimizers}


def other_ranks(cell: str) -> list[int]:
    """Ranks 1.. of a cell id such as ws4-fsdp2-sdpa-adamw."""
    return list(range(1, int(cell.split("-", 1)[0].removeprefix("ws"))))


def first_batch_of_epoch_1(cell: str) -> dict[str, str]:
    """Where epoch 1 begins at the resume matrix's sizes (64 sequences, 2 per rank, resume at step 3):
    its index in the loader's order, and how many batches after the load that is."""
    epoch_start = 64 // (2 * int(cell.split("-", 1)[0].removeprefix("ws")))
    after = epoch_start - 3 + 1
    return {"epoch_start": str(epoch_start), "ordinal": f"{after}th"}


def test_reference_components_pass_every_cell(tmp_path):
    done, outcomes = run_suites(tmp_path / "reference", resume_matrix(REFERENCE_COMPONENTS, BOTH_OPTIMIZERS, (1, 2)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(outcomes) == expected_cells((1, 2), BOTH_OPTIMIZERS), done.stdout
    for cell, tests in outcomes.items():
        assert {after_load(piece) for piece in ("parameters", "optimizer_state", "rng")} <= set(tests), tests
        assert tests.pop(NO_EXTRA_STATE) == "skipped", (
            f"{cell}: the reference checkpointer's save returns no extra state"
        )
        assert tests.pop(NO_IMPLEMENTATIONS) == "skipped", f"{cell}: the matrix has no optimizer_impl axis"
        assert tests and set(tests.values()) == {"passed"}, f"{cell}: {tests}"
    junit = JUnitXml.fromfile(str(tmp_path / "reference" / "reports" / "latest" / "junit.xml"))
    for suite in junit:
        ulps = {prop.name: prop.value for prop in suite.properties() if prop.name.endswith("::loss_max_ulp")}
        assert ulps == {f"resume::{LOSSES}::loss_max_ulp": "0"}, f"{suite.name}: {ulps}"


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_suite_catches_mutant_in_every_cell(tmp_path, mutant):
    overrides, optimizers, failing, must_fail, world_sizes, wide_fsdp = MUTANTS[mutant]
    matrix = resume_matrix({**REFERENCE_COMPONENTS, **overrides}, optimizers, world_sizes, wide_fsdp)
    done, outcomes = run_suites(tmp_path / mutant, matrix)
    failures = cell_failures(tmp_path / mutant / "reports" / "latest" / "torch-system")
    assert done.returncode == 1, f"{mutant}: expected the run to fail\n{done.stdout}{done.stderr}"
    assert set(outcomes) == expected_cells(world_sizes, optimizers, wide_fsdp), done.stdout
    for cell, tests in outcomes.items():
        assert "error" not in tests.values(), (
            f"{mutant} in {cell} crashed the suite instead of failing its checks: {tests}"
        )
        if not cell.startswith(failing):
            passed = {test: result for test, result in tests.items() if test not in SKIPPING_HERE}
            assert set(passed.values()) == {"passed"}, f"{mutant} is correct in {cell}, yet: {failures[cell]}"
            continue
        for test, texts in must_fail.items():
            assert tests.get(test) == "failure", f"{mutant} in {cell}: expected {test} to fail, outcomes {tests}"
            for text in texts:
                text = text.format(other_ranks=other_ranks(cell), **first_batch_of_epoch_1(cell))
                assert text in failures[cell][test], (
                    f"{mutant} in {cell}, {test} must say {text!r}:\n{failures[cell][test]}"
                )
        if mutant == "owned_state_not_saved":
            table = failures[cell][after_load("optimizer_state")]
            assert "matrix_params" not in table and "tensor(" not in table, f"{cell}: a rebuilt table flagged: {table}"
        if mutant != "rank_zero_only":
            partial = [test for test, text in failures[cell].items() if PARTIAL_RESTORE in text]
            assert not partial, f"{mutant} loses its piece on every rank in {cell}, yet {partial} call it partial"
