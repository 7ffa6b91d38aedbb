"""The resume suite is only worth running if it fails on the bugs it exists for: run it through
the real CLI on CPU with the reference components (every cell passes, `loss_max_ulp` recorded as
0) and each mutant of models/mutants/resume.py: every applicable cell fails, each mutant with its
own named message from the right-after-load check of the piece it lost, and none errors out.

One run serves the reference and every mutant but one: axis `variant` picks the model, checkpointer
and training step per cell (tests/suites/resume_variants.py), the cast-on-load optimizer is its
own `optimizer` value, so one rank pool per world size serves them all; every mutant's decoder is one
layer a stack deep, the reference's as deep as the product builds it. The mutant that swaps the
dataset (the `dataset` component gets no cell to pick by) runs alone.

Cells: world size 1 without FSDP and world size 2 with FSDP1 and FSDP2, adamw; the reference
also with precision_aware. The mutants that lose the RNG, the scheduler or the loader position
skip FSDP1 (see PIECE_FSDP). The rank-0-only mutant, the one whose symptom depends on the world
size, also runs at world size 4 (the others lose the same on every rank).
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
from junitparser import JUnitXml

from helpers.checkout import REPO
from helpers.matrix_files import REFERENCE_COMPONENTS, include_table, matrix_toml
from helpers.run_results import cell_failures, run_suites

pytestmark = pytest.mark.slow

REFERENCE = "reference"  # resume_variants.REFERENCE: the variant with no component replaced
BOTH_OPTIMIZERS = ("adamw", "precision_aware")
# The optimizer value whose factory is the cast-on-load precision_aware (bf16 params as precision_aware's).
CAST_ON_LOAD = "cast_on_load"
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
NO_TWIN = "test_each_step_matches_the_forloop_twin"  # skips: no optimizer_impl axis here
SKIPPING_HERE = (NO_EXTRA_STATE, NO_IMPLEMENTATIONS, NO_TWIN)


def after_load(piece: str) -> str:
    return f"test_state_restored_right_after_load[piece={piece}]"


class Mutant(NamedTuple):
    """The optimizers and world sizes to run, the cells (by prefix) where it must fail, and per test
    that must fail there the texts its failure says ({other_ranks}: the cell's ranks but 0); the fsdp
    values of its cells beyond world size 1. Its components: resume_variants.OVERRIDES[name], or
    OWN_RUN[name] for a mutant that runs alone."""

    optimizers: tuple[str, ...]
    failing: tuple[str, ...]
    must_fail: dict[str, tuple[str, ...]]
    world_sizes: tuple[int, ...] = (1, 2)
    wide_fsdp: tuple[str, ...] = ("fsdp1", "fsdp2")


MUTANTS = {
    "raw_optimizer_state_dict": Mutant(
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
        ("adamw",),
        PIECE_CELL_PREFIXES,
        {
            after_load("rng"): ("after load: RNG stream torch CPU differs from the saved one",),
            LOSSES: ("loss at step",),
        },
        wide_fsdp=PIECE_FSDP,
    ),
    "scheduler_not_restored": Mutant(
        ("adamw",),
        PIECE_CELL_PREFIXES,
        {after_load("scheduler"): ("after load: scheduler last_epoch is 0, saved 3",), LOSSES: ("loss at step",)},
        wide_fsdp=PIECE_FSDP,
    ),
    "scheduler_one_step_late": Mutant(
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
        ("adamw",),
        CELL_PREFIXES,
        {after_load("param_groups"): ("after load: param group 0 lr is 0.00166",), LOSSES: ("loss at step",)},
    ),
    "data_position_not_restored": Mutant(
        ("adamw",),
        PIECE_CELL_PREFIXES,
        {
            after_load("loader"): ("after load: loader would yield batch 0, saved at batch 3",),
            LOSSES: ("loss at step",),
        },
        wide_fsdp=PIECE_FSDP,
    ),
    "loader_one_batch_late": Mutant(
        ("adamw",),
        PIECE_CELL_PREFIXES,
        {
            after_load("loader"): ("after load: loader would yield batch 4, saved at batch 3",),
            LOSSES: ("loss at step",),
        },
        wide_fsdp=PIECE_FSDP,
    ),
    "rank_zero_only": Mutant(
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
        ("step_counting",),
        CELL_PREFIXES,
        {
            after_load("rng"): (
                "rank 0: after load: RNG stream model.prefix_layers.0.dropout.generator differs from the saved one",
                "rank 0: after load: RNG stream model.expert_layers.0.dropout.generator does not exist",
                "rank 0: after load: RNG stream optimizer.rounding_generator differs from the saved one",
            ),
            after_load("optimizer_state"): (
                "rank 0: after load: optimizer attribute steps_taken: is 1, saved 3",
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
    # The stack's own training step (the `training_step` component) runs in every step: a loss scaler
    # it keeps and no checkpoint saves skips the first step again after the load. One cell: what it
    # loses is the same at every world size.
    "loss_scaler_not_saved": Mutant(
        ("adamw",),
        ("ws1-none",),
        {LOSSES: ("loss at step", "the runs first part at step 4, in the gradients (")},
        world_sizes=(1,),
    ),
    # A non-persistent buffer the model recomputes after a load, wrongly: every after-load check
    # passes (it is in no state dict), and the losses name the buffer where the runs part.
    "non_persistent_buffer_recomputed_wrongly": Mutant(
        ("adamw",),
        ("ws1-none",),
        {
            LOSSES: (
                "loss at step 4 (resumed at 3)",
                "the model's non-persistent buffers (in no state dict): embed.boost",
            )
        },
        world_sizes=(1,),
    ),
    "precision_aware_cast_on_load": Mutant(
        (CAST_ON_LOAD,),
        CELL_PREFIXES,
        {after_load("optimizer_state"): ("is torch.bfloat16, saved torch.float32",), LOSSES: ("loss at step",)},
    ),
}


# The mutants whose components the `variant` axis cannot pick, with those components: they run alone.
OWN_RUN = {
    "owned_state_not_saved": {
        "model": "torchmatrix.models.mutants.resume:own_generator_dropout_model",
        "dataset": "torchmatrix.models.mutants.resume:ReshufflingTokenDataset",
        "optimizer_step_counting": "torchmatrix.models.mutants.resume:build_step_counting_precision_aware",
    },
}
RESUME_OPTIONS = {"steps": 6, "resume_step": 3}


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
        suites={"resume": {"timeout": 240, "axes": ["world_size", "fsdp", "optimizer"], "options": RESUME_OPTIONS}},
        components=components,
    )


def variant_cells() -> dict[str, set[str]]:
    """The shared run's cells: variant -> its cell ids without the variant."""
    cells = {REFERENCE: expected_cells((1, 2), BOTH_OPTIMIZERS)}
    for name, mutant in MUTANTS.items():
        if name not in OWN_RUN:
            cells[name] = expected_cells(mutant.world_sizes, mutant.optimizers, mutant.wide_fsdp)
    return cells


def variants_matrix(cells: dict[str, set[str]]) -> str:
    """resume over exactly these cells (variant -> ids ws<N>-<fsdp>-sdpa-<optimizer>), as includes of
    an empty product, with tests/suites/resume_variants.py's components."""
    matrix = matrix_toml(
        axes={"world_size": [1], "fsdp": ["none"], "attn": ["sdpa"], "optimizer": ["adamw"], "variant": [REFERENCE]},
        exclude=[{"variant": REFERENCE}],
        suites={
            "resume": {
                "timeout": 240,
                "axes": ["world_size", "fsdp", "optimizer", "variant"],
                "options": {**RESUME_OPTIONS, "bf16_param_optimizers": ["precision_aware", CAST_ON_LOAD]},
            }
        },
        components={
            **REFERENCE_COMPONENTS,
            "model": "resume_variants:build_model",
            "checkpointer": "resume_variants:Checkpointer",
            "training_step": "resume_variants:build_training_step",
            f"optimizer_{CAST_ON_LOAD}": "torchmatrix.models.mutants.resume:build_cast_on_load_precision_aware",
        },
    )
    for variant, ids in cells.items():
        for cell in sorted(ids):
            world_size, fsdp, attn, optimizer = cell.split("-")
            size = int(world_size.removeprefix("ws"))
            matrix += include_table(
                {"world_size": size, "fsdp": fsdp, "attn": attn, "optimizer": optimizer, "variant": variant}
            )
    return matrix


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


class Results(NamedTuple):
    """A run's exit code and output, and per cell id (without the variant) its outcomes and failures."""

    returncode: int
    output: str
    outcomes: dict[str, dict[str, str]]
    failures: dict[str, dict[str, str]]


def by_variant(per_cell: dict[str, dict]) -> dict[str, dict[str, dict]]:
    """{cell id with its variant: x} as {variant: {cell id without it: x}}."""
    grouped: dict[str, dict[str, dict]] = {}
    for cell_id, value in per_cell.items():
        cell, _, variant = cell_id.rpartition("-")
        grouped.setdefault(variant, {})[cell] = value
    return grouped


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory):
    """The one run of the reference and every mutant the variant axis picks: exit code, output,
    {variant: Results}, and the run's JUnit."""
    root = tmp_path_factory.mktemp("variants")
    done, outcomes = run_suites(root, variants_matrix(variant_cells()), REPO / "tests" / "suites", timeout=1800)
    failures = by_variant(cell_failures(root / "reports" / "latest" / "torch-system"))
    output = done.stdout + done.stderr
    results = {
        variant: Results(done.returncode, output, cells, failures.get(variant, {}))
        for variant, cells in by_variant(outcomes).items()
    }
    return done.returncode, output, results, JUnitXml.fromfile(str(root / "reports" / "latest" / "junit.xml"))


def test_the_shared_run_has_every_planned_cell_and_fails(shared_run):
    returncode, output, results, _ = shared_run
    assert returncode == 1, output
    assert {variant: set(result.outcomes) for variant, result in results.items()} == variant_cells(), output


def test_reference_components_pass_every_cell(shared_run):
    _, output, results, junit = shared_run
    outcomes = results[REFERENCE].outcomes
    assert set(outcomes) == expected_cells((1, 2), BOTH_OPTIMIZERS), output
    for cell, tests in outcomes.items():
        tests = dict(tests)
        assert {after_load(piece) for piece in ("parameters", "optimizer_state", "rng")} <= set(tests), tests
        assert tests.pop(NO_EXTRA_STATE) == "skipped", (
            f"{cell}: the reference checkpointer's save returns no extra state"
        )
        assert tests.pop(NO_IMPLEMENTATIONS) == "skipped", f"{cell}: the matrix has no optimizer_impl axis"
        assert tests.pop(NO_TWIN) == "skipped", f"{cell}: the matrix has no optimizer_impl axis"
        assert tests and set(tests.values()) == {"passed"}, f"{cell}: {tests}"
    reference_suites = [suite for suite in junit if suite.name.endswith(f"-{REFERENCE}")]
    assert len(reference_suites) == len(outcomes), [suite.name for suite in junit]
    for suite in reference_suites:
        ulps = {prop.name: prop.value for prop in suite.properties() if prop.name.endswith("::loss_max_ulp")}
        assert ulps == {f"resume::{LOSSES}::loss_max_ulp": "0"}, f"{suite.name}: {ulps}"


def mutant_results(mutant: str, shared_run, root) -> Results:
    """The mutant's cells: from the shared run, or from a run of its own (OWN_RUN)."""
    if mutant not in OWN_RUN:
        return shared_run[2][mutant]
    optimizers, _, _, world_sizes, wide_fsdp = MUTANTS[mutant]
    matrix = resume_matrix({**REFERENCE_COMPONENTS, **OWN_RUN[mutant]}, optimizers, world_sizes, wide_fsdp)
    done, outcomes = run_suites(root, matrix)
    failures = cell_failures(root / "reports" / "latest" / "torch-system")
    return Results(done.returncode, done.stdout + done.stderr, outcomes, failures)


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_suite_catches_mutant_in_every_cell(shared_run, tmp_path, mutant):
    optimizers, failing, must_fail, world_sizes, wide_fsdp = MUTANTS[mutant]
    returncode, output, outcomes, failures = mutant_results(mutant, shared_run, tmp_path / mutant)
    assert returncode == 1, f"{mutant}: expected the run to fail\n{output}"
    assert set(outcomes) == expected_cells(world_sizes, optimizers, wide_fsdp), output
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
