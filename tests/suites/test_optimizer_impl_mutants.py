"""The `optimizer_impl` axis through resume and dtensor_optim, in one real run of the CLI on CPU: the
reference AdamW passes every check in each implementation (forloop, foreach, fused, compiled; the
compiled one the only Inductor compile here), each known-bad implementation of
models/mutants/optimizer_impl.py fails the check written for it with its own message, and a cell
whose factory cannot build its implementation skips, saying why.

Cells: ws1 without FSDP (resume; dtensor_optim skips there) for the reference in forloop, fused and
compiled and for each mutant in the one implementation it breaks; ws2 FSDP2 for the reference in
foreach and fused (resume and dtensor_optim, DTensor params: where foreach over DTensors broke), and
for a foreach whose kernels refuse DTensor params, which must fail, not skip.

The update mutants (weight decay, step count, bias correction, eps) each run in one ws1 cell: today's
checks pass on them, the for-loop twin and the step after a cross-implementation load fail naming the
cause; the valid controls beside them (the hand-written update, a bucketed fused step) pass.

The reference AdamW's eager cells build the decoder as deep as the product does; its compiled cell and
every other optimizer's, one layer a stack (tests/suites/implementation_variants.py): none of their proofs
needs depth, and the compiled step's compile grows with every parameter.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from junitparser import JUnitXml, Skipped

from helpers.checkout import REPO
from helpers.matrix_files import REFERENCE_COMPONENTS, matrix_toml
from helpers.run_results import cell_failures, run_suites

pytestmark = pytest.mark.slow

MUTANTS = "torchmatrix.models.mutants.optimizer_impl"
UPDATE_CONTROLS = ("hand_written", "bucketed_fused")  # valid updates the mutants below are compared against
UPDATE_MUTANTS = (
    "no_decay_on_vectors",
    "no_decay_after_first_group",
    "first_group_bucketed",
    "double_counting",
    "own_step_counter",
    "unrooted_bias_correction",
    "step_ahead_bias_correction",
    "eps_inside_sqrt",
    "eps_before_bias_correction",
)
OPTIMIZERS = {
    "adamw": "torchmatrix.models.optim:build_adamw",
    "precision_aware": "torchmatrix.models.optim:build_precision_aware",
    "no_impl_keyword": "torchmatrix.models.mutants.resume:build_step_counting_precision_aware",
    "step_recast_on_load": f"{MUTANTS}:build_step_recast_on_load",
    "step_recast_after_load": f"{MUTANTS}:build_step_recast_after_load",
    "one_element_step": f"{MUTANTS}:build_one_element_step",
    "kernels_from_checkpoint": f"{MUTANTS}:build_adamw_taking_checkpoint_kernels",
    "foreach_refusing_dtensors": f"{MUTANTS}:build_foreach_refusing_dtensors",
    **{name: f"{MUTANTS}:build_{name}" for name in UPDATE_CONTROLS + UPDATE_MUTANTS},
}
# optimizer -> the implementations its ws1 cells run
WS1_IMPLEMENTATIONS = {
    "adamw": ("forloop", "fused", "compiled"),
    "precision_aware": ("fused",),
    "no_impl_keyword": ("forloop",),
    "step_recast_on_load": ("compiled",),
    "step_recast_after_load": ("compiled",),
    "one_element_step": ("fused",),
    "kernels_from_checkpoint": ("forloop",),
    "foreach_refusing_dtensors": (),
    **{name: ("fused",) for name in UPDATE_CONTROLS + UPDATE_MUTANTS},
    "own_step_counter": ("forloop",),  # its fused step is right but after a load into it
}
# optimizer -> the implementations its ws2 FSDP2 cells run
WS2_IMPLEMENTATIONS = {"adamw": ("foreach", "fused"), "foreach_refusing_dtensors": ("foreach",)}
REFUSED = "ws2-fsdp2-sdpa-foreach_refusing_dtensors-foreach"
REFUSAL = "RuntimeError: foreach AdamW: DTensor params are not supported by the foreach kernels"
IMPLEMENTATIONS = ("forloop", "foreach", "fused", "compiled")

AFTER_LOAD = "test_state_restored_right_after_load[piece={}]"
CROSS_LOAD = "test_checkpoint_loads_into_other_implementations"
TWIN = "test_each_step_matches_the_forloop_twin"
LOSSES = "test_losses_identical_after_resume"
FINAL_STATE = "test_final_optimizer_state_identical"
NO_EXTRA_STATE = AFTER_LOAD.format("extra_state")  # skips: the reference checkpointer's save returns none

# mutant cell -> test that must fail there -> what its message must say
MUST_FAIL = {
    "ws1-none-sdpa-step_recast_on_load-compiled": {
        AFTER_LOAD.format("optimizer_state_dtype_device"): (
            "after load: optimizer state step of embed.weight is torch.float64 on cpu, saved torch.float32 on cpu",
        ),
        AFTER_LOAD.format("optimizer_state"): ("after load: optimizer state step of embed.weight is torch.float64",),
        FINAL_STATE: ("embed.weight.step: torch.float64 on cpu, expected torch.float32 on cpu",),
    },
    "ws1-none-sdpa-step_recast_after_load-compiled": {
        FINAL_STATE: ("embed.weight.step: torch.float64 on cpu, expected torch.float32 on cpu",),
    },
    "ws1-none-sdpa-one_element_step-fused": {
        CROSS_LOAD: (
            "the checkpoint the fused implementation saved does not load exactly into forloop, foreach",
            "into forloop, rank 0: the load raised ValueError: Size mismatch between saved torch.Size([1]) and "
            "current: torch.Size([])",
        ),
    },
    "ws1-none-sdpa-kernels_from_checkpoint-forloop": {
        CROSS_LOAD: (
            "into foreach, rank 0: after load: param group 0 has foreach=False, built with foreach=True: the load "
            "took the forloop checkpoint's kernel flags",
            "into fused, rank 0: after load: param group 0 has fused=False, built with fused=True",
        ),
    },
}
LEFT_OUT_DECAY = ("one of them leaves the weight decay out",)
BIAS_CORRECTION = "a bias correction (or the learning rate) differs"
DENOMINATOR = "the denominator sqrt(v_hat) + eps differs"
NORM = "parameter of prefix_layers.0.attn_norm.weight differs beyond the bound"
EMBEDDING = "parameter of embed.weight differs beyond the bound"
AFTER_THE_LOAD = "the first step after the load: step 4: "
# update mutant cell -> test -> what its message must say; every other test passes there (the mutant
# is consistent with itself: today's checks are green on it)
UPDATE_MUST_FAIL = {
    "ws1-none-sdpa-no_decay_on_vectors-fused": {
        TWIN: ("rank 0, step 1: " + NORM, *LEFT_OUT_DECAY),
        CROSS_LOAD: (AFTER_THE_LOAD + NORM, *LEFT_OUT_DECAY),
    },
    "ws1-none-sdpa-no_decay_after_first_group-fused": {
        TWIN: ("rank 0, step 1: " + NORM, *LEFT_OUT_DECAY),
        CROSS_LOAD: (AFTER_THE_LOAD + NORM, *LEFT_OUT_DECAY),
    },
    "ws1-none-sdpa-first_group_bucketed-fused": {
        TWIN: ("rank 0, step 1: " + NORM, "weight decays 0.1 apart (its param group: weight_decay 0)"),
        CROSS_LOAD: (AFTER_THE_LOAD + NORM,),
    },
    "ws1-none-sdpa-double_counting-fused": {
        TWIN: ("rank 0, step 1: step of embed.weight is 2.0 in the cell, 1.0 in the for-loop twin",),
        CROSS_LOAD: (
            AFTER_THE_LOAD + "step of embed.weight is 7.0 in the forloop run after the load, 8.0 in the fused run",
        ),
    },
    "ws1-none-sdpa-own_step_counter-forloop": {
        CROSS_LOAD: ("into fused, rank 0: " + AFTER_THE_LOAD + EMBEDDING, BIAS_CORRECTION),
    },
    "ws1-none-sdpa-unrooted_bias_correction-fused": {
        TWIN: ("rank 0, step 1: " + EMBEDDING, BIAS_CORRECTION),
        CROSS_LOAD: (AFTER_THE_LOAD + EMBEDDING, BIAS_CORRECTION),
    },
    "ws1-none-sdpa-step_ahead_bias_correction-fused": {
        TWIN: ("rank 0, step 1: " + EMBEDDING, BIAS_CORRECTION),
        CROSS_LOAD: (AFTER_THE_LOAD + EMBEDDING, BIAS_CORRECTION),
    },
    "ws1-none-sdpa-eps_inside_sqrt-fused": {
        TWIN: ("rank 0, step 1: " + EMBEDDING, DENOMINATOR),
        CROSS_LOAD: (AFTER_THE_LOAD + EMBEDDING, DENOMINATOR),
    },
    "ws1-none-sdpa-eps_before_bias_correction-fused": {
        TWIN: ("rank 0, step 1: " + EMBEDDING, DENOMINATOR),
        CROSS_LOAD: (AFTER_THE_LOAD + EMBEDDING, DENOMINATOR),
    },
}
# mutant cell -> tests that see nothing wrong there and must pass (what each mutant breaks is only
# seen by the checks above: the right-after-load pieces when the load is right, the cross-load when
# the cell's own resume round-trips)
MUST_PASS = {
    "ws1-none-sdpa-step_recast_after_load-compiled": (AFTER_LOAD.format("optimizer_state_dtype_device"),),
    "ws1-none-sdpa-one_element_step-fused": (AFTER_LOAD.format("optimizer_state_dtype_device"), LOSSES, FINAL_STATE),
    "ws1-none-sdpa-kernels_from_checkpoint-forloop": (
        AFTER_LOAD.format("param_groups"),
        LOSSES,
        FINAL_STATE,
    ),
}
SKIP_REASONS = {
    "ws1-none-sdpa-precision_aware-fused": "optimizer_impl=fused: PrecisionAwareAdamW has one implementation",
    "ws1-none-sdpa-no_impl_keyword-forloop": (
        "optimizer_impl=forloop: the optimizer factory torchmatrix.models.mutants.resume:"
        "build_step_counting_precision_aware takes no `implementation` keyword"
    ),
}


def implementations_matrix() -> str:
    excluded = [
        {"world_size": size, "optimizer": name, "optimizer_impl": [i for i in IMPLEMENTATIONS if i not in kept]}
        for size, kept_by_optimizer in ((1, WS1_IMPLEMENTATIONS), (2, WS2_IMPLEMENTATIONS))
        for name, kept in kept_by_optimizer.items()
    ]
    return matrix_toml(
        axes={
            "world_size": [1, 2],
            "fsdp": ["none", "fsdp2"],
            "attn": ["sdpa"],
            "optimizer": list(OPTIMIZERS),
            "optimizer_impl": list(IMPLEMENTATIONS),
        },
        exclude=[
            {"fsdp": "none", "world_size": 2},
            {"fsdp": "fsdp2", "world_size": 1},
            {"world_size": 2, "optimizer": [name for name in OPTIMIZERS if name not in WS2_IMPLEMENTATIONS]},
            *excluded,
        ],
        suites={
            name: {
                "timeout": 300,
                "axes": ["world_size", "fsdp", "optimizer", "optimizer_impl"],
                **({"options": {"steps": 6, "resume_step": 3}} if name == "resume" else {}),
            }
            for name in ("resume", "dtensor_optim")
        },
        components={
            **REFERENCE_COMPONENTS,
            "model": "implementation_variants:build_model",
            "batch": "torchmatrix.models.transformer:make_batch",
            **{f"optimizer_{name}": path for name, path in OPTIMIZERS.items()},
        },
    )


def expected_cells() -> set[str]:
    ws1 = {f"ws1-none-sdpa-{name}-{impl}" for name, kept in WS1_IMPLEMENTATIONS.items() for impl in kept}
    return ws1 | {f"ws2-fsdp2-sdpa-{name}-{impl}" for name, kept in WS2_IMPLEMENTATIONS.items() for impl in kept}


@pytest.fixture(scope="module")
def implementations_run(tmp_path_factory):
    """One run of the whole matrix, shared by the tests below: (process, outcomes, failure texts,
    per cell the skip messages)."""
    root = tmp_path_factory.mktemp("optimizer_impl")
    done, outcomes = run_suites(root, implementations_matrix(), components_from=REPO / "tests" / "suites")
    version_dir = root / "reports" / "latest" / "torch-system"
    return done, outcomes, cell_failures(version_dir), skip_messages(version_dir)


def skip_messages(version_dir: Path) -> dict[str, set[str]]:
    """Per cell id, the messages of its skipped tests."""
    return {
        report.stem: {
            case.result[0].message or ""
            for suite in JUnitXml.fromfile(str(report))
            for case in suite
            if case.result and isinstance(case.result[0], Skipped)
        }
        for report in sorted(version_dir.glob("*.xml"))
    }


def test_every_planned_cell_reports(implementations_run):
    done, outcomes, _, _ = implementations_run
    assert done.returncode == 1, f"the mutants must fail the run\n{done.stdout}{done.stderr}"
    assert set(outcomes) == expected_cells(), done.stdout
    errored = {cell: [test for test, result in tests.items() if result == "error"] for cell, tests in outcomes.items()}
    errored.pop(REFUSED)
    assert not any(errored.values()), f"errors instead of failures: {errored}"


@pytest.mark.parametrize("cell", sorted(c for c in expected_cells() if c.split("-")[3] in ("adamw", *UPDATE_CONTROLS)))
def test_reference_passes_in_each_implementation(implementations_run, cell):
    """The reference AdamW in each implementation, and the valid controls (the hand-written update
    the mutants change, torch's fused kernel stepped in buckets with each group's hyper-parameters)."""
    _, outcomes, failures, _ = implementations_run
    tests = dict(outcomes[cell])
    assert tests.pop(NO_EXTRA_STATE) == "skipped", tests
    if cell.endswith("-forloop"):  # the twin is the for-loop itself
        assert tests.pop(TWIN) == "skipped", tests
    assert CROSS_LOAD in tests and AFTER_LOAD.format("optimizer_state_dtype_device") in tests, tests
    if cell.startswith("ws1"):  # dtensor_optim skips cells without FSDP
        tests = {test: result for test, result in tests.items() if result != "skipped" or "model_kind=" not in test}
    assert set(tests.values()) == {"passed"}, f"{cell}: {tests}\n{failures.get(cell)}"
    if cell.startswith("ws2"):
        assert tests["test_reshard_load_is_exact[model_kind=model,reshard=shrink]"] == "passed", tests


@pytest.mark.parametrize("cell", sorted(MUST_FAIL))
def test_each_mutant_fails_its_check_with_its_message(implementations_run, cell):
    _, outcomes, failures, _ = implementations_run
    tests = outcomes[cell]
    for test, texts in MUST_FAIL[cell].items():
        assert tests.get(test) == "failure", f"{cell}: expected {test} to fail, outcomes {tests}"
        for text in texts:
            assert text in failures[cell][test], f"{cell}, {test} must say {text!r}:\n{failures[cell][test]}"
    for test in MUST_PASS.get(cell, ()):
        assert tests.get(test) == "passed", f"{cell}: {test} sees nothing wrong here, yet: {failures[cell].get(test)}"


@pytest.mark.parametrize("cell", sorted(UPDATE_MUST_FAIL))
def test_each_update_mutant_passes_todays_checks_and_fails_the_comparison_by_cause(implementations_run, cell):
    """A false green before the twin: every other test passes on the mutant; the for-loop twin (in its
    own implementation's cell) and the step after a load into another implementation name the cause."""
    _, outcomes, failures, _ = implementations_run
    tests = outcomes[cell]
    for test, texts in UPDATE_MUST_FAIL[cell].items():
        assert tests.get(test) == "failure", f"{cell}: expected {test} to fail, outcomes {tests}"
        for text in texts:
            assert text in failures[cell][test], f"{cell}, {test} must say {text!r}:\n{failures[cell][test]}"
    others = {test: result for test, result in tests.items() if test not in UPDATE_MUST_FAIL[cell]}
    assert set(others.values()) <= {"passed", "skipped"}, f"{cell}: {others}\n{failures[cell]}"


@pytest.mark.parametrize("cell", sorted(SKIP_REASONS))
def test_an_implementation_the_factory_cannot_build_skips_with_the_reason(implementations_run, cell):
    _, outcomes, _, skips = implementations_run
    assert set(outcomes[cell].values()) == {"skipped"}, outcomes[cell]
    assert skips[cell] and all(SKIP_REASONS[cell] in message for message in skips[cell]), skips[cell]


def test_an_implementation_that_breaks_on_dtensor_params_fails_never_skips(implementations_run):
    """Only the factory's UnavailableImplementation skips; a kernel refusing FSDP2's DTensor params is
    the break the cell exists to show: dtensor_optim fails and resume errors, each with the error."""
    _, outcomes, failures, _ = implementations_run
    tests = outcomes[REFUSED]
    dtensor = {test: result for test, result in tests.items() if "model_kind=" in test}
    resume = {test: result for test, result in tests.items() if test not in dtensor}
    assert dtensor and set(dtensor.values()) == {"failure"}, tests
    assert all(REFUSAL in failures[REFUSED][test] for test in dtensor), failures[REFUSED]
    assert resume and set(resume.values()) <= {"error", "failure"}, tests
