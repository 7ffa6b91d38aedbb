"""The dtensor_optim suite is only worth running if it fails on the bugs it exists for: run it
through the real CLI on CPU at world sizes 2 and 4 with FSDP2, where the reference
precision-aware optimizer passes every cell and each mutant of models/mutants/dtensor_state.py
fails the checks that should see it.

The optimizer mutants ride along as extra values of the `optimizer` axis (one component each),
so a single run with one rank pool per world size covers them all, their cells one layer a stack deep
(the reference's as deep as the product builds it); its checkpointer
(tests/suites/dtensor_variants.py) is the reference one, so the sharded-save check reads what
`checkpointer().save` wrote, except in the ws2 cells of two more optimizer values, the reference
optimizer saved by a per-call mutant checkpointer: one that saves optimizer state unsharded is caught,
and state saved sharded but keyed by position is described so (issue 30). Small runs at world size 2
prove the rest: without a checkpointer the suite checks torch's helpers' save and says so; the
reshard goes through a bound checkpointer that takes a process group (a mutant of it that never
loads the optimizer fails there),
and, for a manager without a process group, in worlds of their own (issue 40). After every reshard load
the training goes on and is compared with the run that never stopped: an optimizer that loads its
state and then ignores it fails there.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from junitparser import JUnitXml

from helpers.checkout import REPO
from helpers.matrix_files import matrix_toml
from helpers.run_results import cell_failures, run_suites

pytestmark = pytest.mark.slow

REFERENCE = "precision_aware"
NEVER_SKIPPED_ON_FSDP2 = ("test_state_is_laid_out_like_its_param", "test_saved_state_is_sharded")

# optimizer axis value -> (component, model kinds on which every test that runs must fail);
# the shapeless mutant is only wrong where shards are uneven, so only the probe sees it
MUTANTS = {
    "plain_local_state": ("torchmatrix.models.mutants.dtensor_state:PlainLocalStateAdamW", ("model", "uneven_probe")),
    "replicated_state": ("torchmatrix.models.mutants.dtensor_state:ReplicatedStateAdamW", ("model", "uneven_probe")),
    "shapeless_state": ("torchmatrix.models.mutants.dtensor_state:ShapelessStateAdamW", ("uneven_probe",)),
}
# Right after a step, wrong after `load_state_dict`: only the reshard into more ranks sees it, and it
# must name the layout before the gather that such state crashes.
LOAD_MUTANTS = {"shapeless_on_load": "torchmatrix.models.mutants.dtensor_state:ShapelessOnLoadAdamW"}
# Exact right after the load, wrong in the steps after it: only the training after a reshard sees it.
CONTINUATION_MUTANTS = {"loaded_moments_ignored": "torchmatrix.models.mutants.dtensor_state:LoadedMomentsIgnoredAdamW"}
# The reference optimizer, saved by a per-call mutant checkpointer (dtensor_variants.CHECKPOINTER_VARIANTS).
UNSHARDED_SAVE, RAW_STATE_DICT = "unsharded_save", "raw_state_dict"
CHECKPOINTER_VARIANTS = {
    UNSHARDED_SAVE: "dtensor_variants:build_unsharded_save",
    RAW_STATE_DICT: "dtensor_variants:build_raw_state_dict",
}
WS2_ONLY = {**LOAD_MUTANTS, **CONTINUATION_MUTANTS, **CHECKPOINTER_VARIANTS}
RESHARD = "test_reshard_load_is_exact"
WORLD_SIZES = (2, 4)
CHECKPOINTER = "torchmatrix.models.checkpoint:Checkpointer"
VARIANTS_CHECKPOINTER = "dtensor_variants:Checkpointer"
REFERENCE_MODEL = "torchmatrix.models.transformer:build_model"
VARIANTS_MODEL = "dtensor_variants:build_model"  # one layer a stack but in the reference optimizer's cells
SAVED = "test_saved_state_is_sharded"


def dtensor_matrix(
    optimizers=(REFERENCE, *MUTANTS, *WS2_ONLY),
    world_sizes=WORLD_SIZES,
    checkpointer: str | None = CHECKPOINTER,
    model: str = REFERENCE_MODEL,
) -> str:
    """FSDP2 cells of these world sizes, these optimizers (the reference one and mutants), the checkpointer if
    any, and this model."""
    optimizers = list(optimizers)
    components = {
        "model": model,
        "batch": "torchmatrix.models.transformer:make_batch",
        "parallelize": "torchmatrix.models.parallel:parallelize",
        f"optimizer_{REFERENCE}": "torchmatrix.models.optim:build_precision_aware",
        **{f"optimizer_{name}": path for name, (path, _) in MUTANTS.items() if name in optimizers},
        **{f"optimizer_{name}": path for name, path in WS2_ONLY.items() if name in optimizers},
        **({"checkpointer": checkpointer} if checkpointer else {}),
    }
    ws2_only = [name for name in WS2_ONLY if name in optimizers]
    return matrix_toml(
        axes={"world_size": list(world_sizes), "fsdp": ["fsdp2"], "attn": ["sdpa"], "optimizer": optimizers},
        exclude=[{"world_size": size, "optimizer": ws2_only} for size in world_sizes if size != 2 and ws2_only],
        suites={
            "dtensor_optim": {
                "timeout": 120,
                "axes": ["world_size", "fsdp", "optimizer"],
                "options": {"bf16_param_optimizers": optimizers},
            }
        },
        components=components,
    )


@pytest.fixture(scope="module")
def run_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dtensor_mutants")


@pytest.fixture(scope="module")
def run(run_root) -> tuple[subprocess.CompletedProcess, dict[str, dict[str, str]]]:
    """One run of the suite over reference and mutant cells; per cell id, test -> outcome."""
    matrix = dtensor_matrix(checkpointer=VARIANTS_CHECKPOINTER, model=VARIANTS_MODEL)
    return run_suites(run_root, matrix, REPO / "tests" / "suites")


def cell_id(world_size: int, optimizer: str) -> str:
    return f"ws{world_size}-fsdp2-sdpa-{optimizer}"


def test_run_fails_and_reports_every_cell(run):
    done, outcomes = run
    assert done.returncode == 1, f"mutant cells must fail the run\n{done.stdout}{done.stderr}"
    expected = {cell_id(ws, opt) for ws in WORLD_SIZES for opt in [REFERENCE, *MUTANTS]}
    assert set(outcomes) == expected | {cell_id(2, opt) for opt in WS2_ONLY}, done.stdout


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_reference_passes(run, world_size):
    tests = run[1][cell_id(world_size, REFERENCE)]
    assert tests and set(tests.values()) <= {"passed", "skipped"}, tests
    assert "passed" in tests.values(), tests


def test_the_reference_trains_on_after_a_reshard_as_if_it_never_stopped(run, run_root):
    """At world size 2 the run that never stopped reaches the saved state bit for bit (a mean of two
    equal gradients is exact), so the steps after every reshard load are compared bit for bit."""
    continued = recorded_per_test(run_root, "reshard_continued")[cell_id(2, REFERENCE)]
    assert len(continued) == 4, continued
    for line in continued.values():
        assert " 2 steps, " in line and line.endswith("tensors and every loss compared bit for bit"), continued


def test_state_the_optimizer_ignores_after_the_load_fails_the_training_after_it(run, run_root):
    """LoadedMomentsIgnoredAdamW loads its state exactly, then restarts its moments: every reshard
    load compares equal, and the steps after it differ from the run that never stopped, continued at
    the load's world size; every check before the load passes."""
    cell = cell_id(2, "loaded_moments_ignored")
    tests = run[1][cell]
    reshards = {test: result for test, result in tests.items() if test.startswith(RESHARD)}
    assert len(reshards) == 4 and set(reshards.values()) == {"failure"}, tests
    failures = cell_failures(run_root / "reports" / "latest" / "torch-system")[cell]
    for test in reshards:
        assert "training after the load differs from the run that never stopped, continued at" in failures[test]
        assert "loss of step 2 after the load" in failures[test] and "differ after load:" not in failures[test]
    assert {result for test, result in tests.items() if test not in reshards} == {"passed"}, tests


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_suite_catches_mutant(run, mutant, world_size):
    tests = run[1][cell_id(world_size, mutant)]
    print(f"{mutant} x ws{world_size}: failed {sorted(test for test, result in tests.items() if result == 'failure')}")
    assert "error" not in tests.values(), f"{mutant} crashed the suite instead of failing its checks: {tests}"
    kinds = MUTANTS[mutant][1]
    watching = {test: result for test, result in tests.items() if any(f"model_kind={kind}" in test for kind in kinds)}
    for check in NEVER_SKIPPED_ON_FSDP2:
        assert any(test.startswith(check) for test in watching), f"{check} did not run: {tests}"
    missed = sorted(test for test, result in watching.items() if result not in ("failure", "skipped"))
    assert not missed, f"{mutant} at ws{world_size}: expected {missed} to fail, outcomes {tests}"


def test_a_layout_broken_by_the_load_is_named_before_the_gather_it_crashes(run, run_root):
    """The uneven probe's state, re-wrapped without its global shape on load: the reshard into more
    ranks (1 -> 2; one cell, the ws4 one would only repeat it at 2 -> 4) fails with the layout line
    of each rank (global shape 8 where the param has 7) before the crash of the gather after it;
    every check before the load passes."""
    cell = cell_id(2, "shapeless_on_load")
    tests = run[1][cell]
    grow = "test_reshard_load_is_exact[model_kind=uneven_probe,reshard=grow]"
    assert tests[grow] == "failure", tests
    failure = cell_failures(run_root / "reports" / "latest" / "torch-system")[cell][grow]
    first_line = "state laid out unlike its param right after load, before anything gathered it:"
    assert first_line in failure, failure
    assert "rank 0: state 'master' of " in failure and "has global shape torch.Size([8, " in failure, failure
    before_load = {test: result for test, result in tests.items() if not test.startswith("test_reshard_load_is_exact")}
    assert set(before_load.values()) <= {"passed", "skipped"}, tests


def layout_sources(root: Path) -> dict[str, set[str]]:
    """Per cell id, every `layout_source` the sharded-save check recorded in the run at `root`."""
    junit = JUnitXml.fromfile(str(root / "reports" / "latest" / "junit.xml"))
    return {
        suite.name.split("/", 1)[1]: {
            prop.value for prop in suite.properties() if prop.name.endswith("::layout_source")
        }
        for suite in junit
    }


def test_the_sharded_save_check_reads_what_the_checkpointer_wrote(run, run_root):
    """The main run names a checkpointer, so that is the save every cell's check read."""
    sources = layout_sources(run_root)
    assert set(sources) == set(run[1])
    read = f"checkpointer {VARIANTS_CHECKPOINTER} (the DCP checkpoint its save wrote)"
    assert all(found == {read} for cell, found in sources.items() if cell.endswith(REFERENCE)), sources
    failed = f"checkpointer {VARIANTS_CHECKPOINTER} (its save failed)"
    assert all(found <= {read, failed} for found in sources.values()), sources


def failing_run(root: Path, checkpointer: str) -> tuple[dict[str, str], dict[str, str]]:
    """The reference optimizer's ws2 cell run with `checkpointer`, which must fail the run: its outcomes and failures."""
    done, outcomes = run_suites(root, dtensor_matrix((REFERENCE,), (2,), checkpointer))
    assert done.returncode == 1, done.stdout + done.stderr
    return outcomes[cell_id(2, REFERENCE)], cell_failures(root / "reports" / "latest" / "torch-system")[
        cell_id(2, REFERENCE)
    ]


def test_suite_catches_a_checkpointer_that_saves_optimizer_state_unsharded(run, run_root):
    tests = run[1][cell_id(2, UNSHARDED_SAVE)]
    failures = cell_failures(run_root / "reports" / "latest" / "torch-system")[cell_id(2, UNSHARDED_SAVE)]
    saved = {test: result for test, result in tests.items() if test.startswith(SAVED)}
    assert len(saved) == 2 and set(saved.values()) == {"failure"}, tests
    assert all("expected 2 chunks, one per rank" in failures[test] for test in saved), failures
    assert {result for test, result in tests.items() if test not in saved} <= {"passed"}, tests


def test_without_a_checkpointer_it_checks_torch_helpers_save_and_says_so(tmp_path):
    done, outcomes = run_suites(tmp_path, dtensor_matrix((REFERENCE, "plain_local_state"), (2,), None))
    assert done.returncode == 1, done.stdout + done.stderr
    caught = {test: result for test, result in outcomes[cell_id(2, "plain_local_state")].items() if SAVED in test}
    assert len(caught) == 2 and set(caught.values()) == {"failure"}, outcomes
    assert set(outcomes[cell_id(2, REFERENCE)].values()) == {"passed"}, outcomes
    sources = layout_sources(tmp_path)
    assert sources == {
        cell_id(2, optimizer): {"torch get_optimizer_state_dict + dcp.save (no checkpointer in [components])"}
        for optimizer in (REFERENCE, "plain_local_state")
    }


def recorded(root: Path, name: str) -> set[str]:
    """Every value of property `name` the run at `root` recorded."""
    return {value for tests in recorded_per_test(root, name).values() for value in tests.values()}


def recorded_per_test(root: Path, name: str) -> dict[str, dict[str, str]]:
    """Per cell id, per test, the value of property `name` the run at `root` recorded."""
    junit = JUnitXml.fromfile(str(root / "reports" / "latest" / "junit.xml"))
    found: dict[str, dict[str, str]] = {}
    for suite in junit:
        for prop in suite.properties():
            test, _, prop_name = prop.name.rpartition("::")
            if prop_name == name:
                found.setdefault(suite.name.split("/", 1)[1], {})[test] = prop.value
    return found


def test_state_stored_sharded_but_keyed_by_position_is_described_so(run, run_root):
    """`optimizer.state_dict()` saved as is: sharded (DTensor state), keyed `optimizer.state.<index>.<state>`;
    the check passes and says both, each on its own line."""
    cell = cell_id(2, RAW_STATE_DICT)
    assert set(run[1][cell].values()) == {"passed"}, run[1][cell]
    layouts = set(recorded_per_test(run_root, "state_layout")[cell].values())
    assert len(layouts) == 2, layouts
    for lines in (layout.split(" | ") for layout in layouts):
        assert len(lines) == 2, lines
        sharded, keyed = lines
        count = sharded.removeprefix("stored sharded: ").split(" param-shaped")[0]
        total = count.split(" of ")[1]
        assert count == f"{total} of {total}", lines
        assert keyed.startswith(f"keyed by position: {count} param-shaped states (e.g. optimizer.state."), lines


def test_the_reshard_goes_through_a_bound_checkpointer_that_takes_a_process_group(tmp_path):
    """A manager that never loads the optimizer back: only a reshard through it sees that (torch's helpers restore it)."""
    tests, failures = failing_run(
        tmp_path, "torchmatrix.models.mutants.dtensor_state:OptimizerNotLoadedBoundCheckpointer"
    )
    reshards = {test: result for test, result in tests.items() if test.startswith("test_reshard_load_is_exact")}
    assert len(reshards) == 4 and set(reshards.values()) == {"failure"}, tests
    assert all("tensors differ after load: optimizer." in failures[test] for test in reshards), failures
    assert {result for test, result in tests.items() if test not in reshards} == {"passed"}, tests
    assert recorded(tmp_path, "reshard_source") == {"checkpointer"}
    (worlds,) = recorded(tmp_path, "reshard_worlds")
    assert worlds.startswith("sub-worlds of the cell's ranks"), worlds


def test_a_checkpoint_manager_without_a_process_group_reshards_in_worlds_of_their_own(tmp_path):
    """The same manager without `process_group` saves and loads over the whole default group, so each
    side of the reshard runs on a rank pool of its own size (the uneven probe's two reshards, 2 -> 1
    and 1 -> 2), and the optimizer it never loads is found there too."""
    checkpointer = "torchmatrix.models.mutants.dtensor_state:OptimizerNotLoadedWorldCheckpointer"
    reshards = [f"{RESHARD}[model_kind=uneven_probe,reshard={reshard}]" for reshard in ("shrink", "grow")]
    matrix = dtensor_matrix((REFERENCE,), (2,), checkpointer)
    done, outcomes = run_suites(tmp_path, matrix, tests=[f"dtensor_optim::{test}" for test in reshards])
    assert done.returncode == 1, done.stdout + done.stderr
    assert outcomes[cell_id(2, REFERENCE)] == dict.fromkeys(reshards, "failure"), outcomes
    failures = cell_failures(tmp_path / "reports" / "latest" / "torch-system")[cell_id(2, REFERENCE)]
    for test in reshards:
        assert "(each side in a world of its own): " in failures[test], failures[test]
        assert "tensors differ after load: optimizer." in failures[test], failures[test]
    assert recorded(tmp_path, "reshard_source") == {"checkpointer"}
    (worlds,) = recorded(tmp_path, "reshard_worlds")
    assert worlds.startswith("worlds of their own") and f"checkpointer {checkpointer} takes no process_group" in worlds


def test_a_stack_held_by_a_trainers_wrapper_is_read_through_it(tmp_path):
    """Fabric's shape (models/trainer_held.py): what the suites hold names a parameter
    `_forward_module.model.layers.0...`, the checkpoint `model.layers.0...`; the names are read
    through the wrapper, so the sharded save is found by parameter name and passes."""
    matrix = dtensor_matrix((REFERENCE,), (2,), "torchmatrix.models.trainer_held:HeldModuleCheckpointer")
    matrix = matrix.replace(
        "torchmatrix.models.transformer:build_model", "torchmatrix.models.trainer_held:build_user_model"
    )
    matrix = matrix.replace(
        "torchmatrix.models.parallel:parallelize", "torchmatrix.models.trainer_held:parallelize_held"
    )
    done, outcomes = run_suites(tmp_path, matrix, tests=[f"dtensor_optim::{SAVED}[model_kind=model]"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(outcomes[cell_id(2, REFERENCE)].values()) == {"passed"}, outcomes
    layouts = recorded(tmp_path, "state_layout")
    assert layouts and all(
        "keyed by parameter name" in layout and "e.g. optimizer.state.model." in layout for layout in layouts
    ), layouts
