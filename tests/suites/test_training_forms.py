"""The training side of the protocol in the forms real stacks have (issue 30), through the real CLI
on CPU, one world-size-2 FSDP2 cell per run.

The passing run: a causal LM called with `input_ids`/`labels` keywords (`batch_keywords`) that
returns a dict, the stack's own scheduler builder (a container of torch schedulers), and a bound
checkpoint manager taking a process group, which returns `tokens_seen` from `save` and `load` and
keeps rank 0's RNG for every rank, under `seeding = "replicated"`: resume passes every piece,
extra state included, and dtensor_optim reshards through the manager itself.

The failing run keeps the model and changes one thing per piece: `seeding = "per_rank"` (the same
RNG handling is now wrong, and the failure says why), a manager whose `load` loses `tokens_seen`,
and a scheduler container that never loads its state. Each fails its own piece, nothing else does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from junitparser import JUnitXml

from helpers.matrix_files import matrix_toml
from helpers.run_results import cell_failures, run_suites

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
CELL = "ws2-fsdp2-sdpa-adamw"
STACK = {
    "model": "trainer_stack:build_keyword_lm",
    "batch": "trainer_stack:keyword_batch",
    "parallelize": "torchmatrix.models.parallel:parallelize",
    "optimizer_adamw": "torchmatrix.models.optim:build_adamw",
    "checkpointer": "torchmatrix.models.checkpoint:BoundCheckpointer",
    "dataset": "torchmatrix.models.data:TokenDataset",
    "scheduler": "trainer_stack:warmup_cosine",
}
RESUME_OPTIONS = {"steps": 6, "resume_step": 3, "warmup_steps": 2, "batch_keywords": ["input_ids", "labels"]}


def after_load(piece: str) -> str:
    return f"test_state_restored_right_after_load[piece={piece}]"


def training_matrix(components: dict, seeding: str, suites: tuple[str, ...]) -> str:
    table = {
        "resume": {"timeout": 240, "options": {**RESUME_OPTIONS, "seeding": seeding}},
        "dtensor_optim": {"timeout": 240},
    }
    return matrix_toml(
        axes={"world_size": [2], "fsdp": ["fsdp2"], "attn": ["sdpa"], "optimizer": ["adamw"]},
        suites={name: {**table[name], "axes": ["world_size", "fsdp", "optimizer"]} for name in suites},
        components=components,
    )


def properties(root: Path, name: str) -> set[str]:
    """Every value of property `name` the cell's tests recorded."""
    junit = JUnitXml.fromfile(str(root / "reports" / "latest" / "junit.xml"))
    return {prop.value for suite in junit for prop in suite.properties() if prop.name.endswith(f"::{name}")}


@pytest.fixture(scope="module")
def passing(tmp_path_factory):
    root = tmp_path_factory.mktemp("training_forms_pass")
    done, outcomes = run_suites(root, training_matrix(STACK, "replicated", ("resume", "dtensor_optim")), HERE)
    return root, done, outcomes[CELL]


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    root = tmp_path_factory.mktemp("training_forms_fail")
    components = {
        **STACK,
        "checkpointer": "torchmatrix.models.mutants.resume:StepOnlyBoundCheckpointer",
        "scheduler": "trainer_stack:warmup_cosine_not_restored",
    }
    done, outcomes = run_suites(root, training_matrix(components, "per_rank", ("resume",)), HERE)
    return root, done, outcomes[CELL], cell_failures(root / "reports" / "latest" / "torch-system")[CELL]


def test_the_stack_as_written_passes_resume_and_dtensor_optim(passing):
    root, done, tests = passing
    assert done.returncode == 0, done.stdout + done.stderr
    resume = {test: result for test, result in tests.items() if test.startswith(("test_state_restored", "test_losses"))}
    assert {after_load(piece) for piece in ("extra_state", "scheduler", "rng", "loader")} <= set(resume), tests
    assert set(resume.values()) == {"passed"}, tests


def test_dtensor_optim_reshards_through_the_bound_checkpointer(passing):
    root, _, tests = passing
    reshards = {test: result for test, result in tests.items() if test.startswith("test_reshard_load_is_exact")}
    assert len(reshards) == 4 and set(reshards.values()) == {"passed"}, tests
    assert properties(root, "reshard_source") == {"checkpointer"}


def test_rank_zero_rng_fails_under_per_rank_seeding_saying_why(failing):
    _, _, tests, failures = failing
    assert tests[after_load("rng")] == "failure", tests
    text = failures[after_load("rng")]
    assert "rank 1: after load: RNG stream torch CPU differs from the saved one" in text, text
    assert "ranks [1] hold the RNG streams rank 0 saved, not their own" in text, text
    assert 'seeding = "replicated"' in text, text


def test_a_load_that_loses_extra_state_fails_naming_the_key(failing):
    _, _, tests, failures = failing
    assert tests[after_load("extra_state")] == "failure", tests
    text = failures[after_load("extra_state")]
    assert "rank 0: after load: extra state 'tokens_seen' missing from what load returned" in text, text


def test_the_stack_scheduler_is_the_one_that_ran(failing):
    """Only the stack's own container fails this way: the suite's default scheduler loads its state."""
    _, done, tests, failures = failing
    assert done.returncode == 1, done.stdout + done.stderr
    assert tests[after_load("scheduler")] == "failure", tests
    assert "after load: scheduler current LR is [" in failures[after_load("scheduler")], failures
    untouched = ("parameters", "optimizer_state", "param_groups", "loader")
    assert {tests[after_load(piece)] for piece in untouched} == {"passed"}, tests
