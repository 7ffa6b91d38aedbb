"""The resume suite's asynchronous saves are only worth running if they fail on the bugs they exist
for: one run through the real CLI on CPU, every cell saving with `checkpointer_async` (option
`async_save = ["*"]`), axis `variant` picking the checkpointer (tests/suites/resume_variants.py).

Each mutant of models/mutants/async_checkpoint.py fails, by cause, the test that names it
(`test_checkpoint_holds_the_state_at_its_save`); the controls pass every test: DCP's own async_save,
the staged one whose stager serves both saves, a copying save behind the writer that waits for the
next step, and an aliasing save awaited before the step. One rank and four steps: what the mutants
lose does not depend on the world size (ws2 FSDP2 is the default matrix's async cell), nor on depth: every
variant but the reference builds the decoder one layer a stack deep.
"""

from __future__ import annotations

import pytest

from helpers.checkout import REPO
from helpers.matrix_files import REFERENCE_COMPONENTS, matrix_toml
from helpers.run_results import cell_failures, run_suites

pytestmark = pytest.mark.slow

HOLDS = "test_checkpoint_holds_the_state_at_its_save"
SKIPPING_HERE = (
    "test_state_restored_right_after_load[piece=extra_state]",  # these checkpointers' save returns none
    "test_checkpoint_loads_into_other_implementations",  # no optimizer_impl axis here
    "test_each_step_matches_the_forloop_twin",
)
CONTROLS = ("reference", "staged", "slow_writer", "awaited_unstaged")
# variant -> per failing test, the texts its failure must say (the save at step 2, the next step 3)
MUTANTS = {
    "unstaged_cpu_tensors": {
        HOLDS: (
            "rank 0: after load: parameter embed.weight holds step 3's value, the save was at step 2",
            "rank 0: after load: optimizer state exp_avg of embed.weight holds step 3's value, the save was at step 2",
            "step 3, taken after the save at step 2 returned, reached the checkpoint",
        ),
        "test_state_restored_right_after_load[piece=parameters]": ("after load: parameter embed.weight ",),
        "test_state_restored_right_after_load[piece=optimizer_state]": ("after load: optimizer state exp_avg of ",),
    },
    "torn_step": {
        HOLDS: (
            "rank 0: the checkpoint is torn: step from step 3, while exp_avg, exp_avg_sq, parameter from step 2, the save's",
            "rank 0: after load: optimizer state step of embed.weight holds step 3's value, the save was at step 2",
        ),
        "test_state_restored_right_after_load[piece=optimizer_state]": (
            "after load: optimizer state step of embed.weight is 3.0, saved 2.0",
        ),
    },
    "stager_not_reusable": {
        HOLDS: (
            "rank 0: the save at step 2 raised KeyError: <class 'type'>, where the same checkpointer's save at step 1 "
            "had worked: it cannot save twice",
        ),
    },
}
CELL = "ws1-none-sdpa-adamw"


@pytest.fixture(scope="module")
def async_run(tmp_path_factory):
    """The one run: per variant, its outcomes, failure texts and JUnit properties."""
    root = tmp_path_factory.mktemp("async-saves")
    matrix = matrix_toml(
        axes={
            "world_size": [1],
            "fsdp": ["none"],
            "attn": ["sdpa"],
            "optimizer": ["adamw"],
            "variant": [*CONTROLS, *MUTANTS],
        },
        suites={
            "resume": {
                "timeout": 240,
                "axes": ["world_size", "fsdp", "optimizer", "variant"],
                "options": {"steps": 4, "resume_step": 2, "async_save": ["*"]},
            }
        },
        components={
            **REFERENCE_COMPONENTS,
            "model": "resume_variants:build_model",
            "checkpointer": "resume_variants:Checkpointer",
            "checkpointer_async": "resume_variants:AsyncCheckpointer",
        },
    )
    done, outcomes = run_suites(root, matrix, REPO / "tests" / "suites", timeout=900)
    failures = cell_failures(root / "reports" / "latest" / "torch-system")
    return done, outcomes, failures, in_flight_properties(root / "reports" / "latest" / "junit.xml")


def in_flight_properties(junit_path) -> dict[str, str]:
    """Per cell id, the `save_in_flight` property the holds test recorded."""
    from junitparser import JUnitXml

    return {
        suite.name.rpartition("/")[2]: prop.value
        for suite in JUnitXml.fromfile(str(junit_path))
        for prop in suite.properties()
        if prop.name.endswith("::save_in_flight")
    }


@pytest.mark.parametrize("variant", CONTROLS)
def test_valid_asynchronous_saves_pass(async_run, variant):
    done, outcomes, failures, in_flight = async_run
    cell = f"{CELL}-{variant}"
    tests = {test: outcome for test, outcome in outcomes[cell].items() if test not in SKIPPING_HERE}
    assert HOLDS in tests and set(tests.values()) == {"passed"}, f"{cell}: {tests}\n{failures.get(cell)}"
    if variant == "slow_writer":  # its upload waits for the step: in flight by construction
        assert in_flight[cell] == "in flight", in_flight
    if variant == "awaited_unstaged":  # awaited inside save: done by construction
        assert in_flight[cell] == "done before the step", in_flight


@pytest.mark.parametrize("variant", list(MUTANTS))
def test_suite_catches_asynchronous_save_mutant_by_cause(async_run, variant):
    done, outcomes, failures, _ = async_run
    cell = f"{CELL}-{variant}"
    assert done.returncode == 1, done.stdout + done.stderr
    tests = outcomes[cell]
    assert "error" not in tests.values(), f"{variant} crashed the suite instead of failing its checks: {tests}"
    for test, texts in MUTANTS[variant].items():
        assert tests.get(test) == "failure", f"{variant}: expected {test} to fail, outcomes {tests}"
        for text in texts:
            assert text in failures[cell][test], f"{variant}, {test} must say {text!r}:\n{failures[cell][test]}"
    if variant == "torn_step":  # the parameters and moments are the save's: only `step` is torn
        assert tests["test_state_restored_right_after_load[piece=parameters]"] == "passed", tests
    if variant == "stager_not_reusable":  # nothing to load: every other test says so and skips
        others = {test: outcome for test, outcome in tests.items() if test != HOLDS}
        assert set(others.values()) == {"skipped"}, others
