"""The grad-ckpt suite on models written as real stacks write them (issue 30): a function as the
checkpoint unit (`checkpoint(self._run_layer, i, hidden, cache)`), a dict-of-dicts KV cache that
forward keeps in a local variable and never returns, a loss returned as a bare tensor, no
`body_calls()` or `decoder_layers()`, and a model that declares its own compute dtype. One real
`torchmatrix run` over ws1 cells, one per model (axis `form`), read by every test below; then the
prefix/suffix example as a user runs it.
"""

from __future__ import annotations

import pytest
from junitparser import JUnitXml

from helpers.checkout import REPO
from helpers.matrix_files import matrix_toml
from helpers.projects import Project

pytestmark = pytest.mark.slow

FORMS = {
    "plain": "function_units.build_function_unit_model",
    "bf16_compute": "function_units.build_bfloat16_compute_model",
    "history": "mutants.hidden_cache_history_model",
    "rng": "mutants.function_unit_rng_forgetting_model",
    "counter": "mutants.function_unit_counter_model",
}
FORMS_MODULE = f"""
from torchmatrix.models import function_units
from torchmatrix.models.mutants import grad_ckpt as mutants

FACTORIES = {{{", ".join(f"{form!r}: {factory}" for form, factory in FORMS.items())}}}


def build(cell, **kwargs):
    return FACTORIES[cell["form"]](cell, **kwargs)
"""
GRADIENTS = "test_checkpointing_leaves_loss_and_gradients_unchanged[dropout={}]"
RECOMPUTE = "test_recompute_reruns_layers_and_rewrites_cache_identically"
ATTRIBUTES = "test_checkpointing_leaves_module_attributes_unchanged"
BUFFERS = "test_checkpointing_leaves_every_buffer_unchanged"
MICRO_BATCHES = "test_micro_batches_before_one_backward_leave_gradients_unchanged"
EAGER_TWIN = "test_compiled_steps_match_their_eager_twin"  # skips in these eager cells
ANOTHER_LENGTH = "test_forward_at_another_length_leaves_gradients_unchanged"  # and so does this one


def read_run(root, done) -> tuple[dict, dict]:
    """{cell: {test: case}} and {cell: {property: value}} of the run's merged JUnit."""
    cases, properties = {}, {}
    for suite in JUnitXml.fromfile(str(root / "out" / "latest" / "junit.xml")):
        cell = suite.name.split("/", 1)[1]
        cases[cell] = {case.name.split("[torch=", 1)[0]: case for case in suite}
        properties[cell] = {prop.name: prop.value for prop in suite.properties()}
    assert cases, done.stdout + done.stderr
    return cases, properties


def text(case) -> str:
    return "\n".join(f"{result.message or ''}\n{result.text or ''}" for result in case.result)


@pytest.fixture(scope="module")
def forms_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("forms")
    project = Project(root)
    project.write("forms.py", FORMS_MODULE)
    project.write(
        "matrix.toml",
        matrix_toml(
            torch=["2.13.0"],
            axes={"world_size": [1], "fsdp": ["none"], "attn": ["sdpa"], "form": list(FORMS)},
            suites={"grad_ckpt": {"path": None, "timeout": 120, "axes": ["world_size", "fsdp", "attn", "form"]}},
            components={
                "model": "forms:build",
                "parallelize": "torchmatrix.models.function_units:parallelize_function_units",
                "batch": "torchmatrix.models.transformer:make_batch",
            },
        ),
    )
    done = project.torchmatrix("run", "--torch", "system", "--reports", "out", "--confirm-limit", "0")
    return read_run(root, done)


def cell(form: str) -> str:
    return f"ws1-none-sdpa-{form}"


def test_function_unit_with_a_hidden_dict_cache_and_a_tensor_loss_passes_every_check(forms_run):
    """Recompute counted on `FunctionUnitDecoder._run_layer#n` and the cache found through the hook:
    the recompute check runs (not skipped) and every check passes."""
    cases, _ = forms_run
    tests = cases[cell("plain")]
    skipping = (BUFFERS, EAGER_TWIN, ANOTHER_LENGTH)
    failed = {name: text(case) for name, case in tests.items() if not (case.is_passed or name in skipping)}
    assert not failed, failed
    assert tests[BUFFERS].is_skipped, "the decoder has no buffers"
    assert tests[EAGER_TWIN].is_skipped and tests[ANOTHER_LENGTH].is_skipped, "an eager cell has no compiled step"


def test_recompute_appending_to_a_cache_forward_never_returned_is_caught_through_the_hook(forms_run):
    cases, _ = forms_run
    case = cases[cell("history")][RECOMPUTE]
    assert case.is_failure, text(case)
    assert "cache entry cache[0]['history'][1]: missing from the second (with checkpointing" in text(case)
    assert all(cases[cell("history")][test].is_passed for test in (GRADIENTS.format(0.0), ATTRIBUTES))


def test_a_function_unit_without_rng_replay_is_caught(forms_run):
    cases, _ = forms_run
    case = cases[cell("rng")][GRADIENTS.format(0.1)]
    assert case.is_failure, text(case)
    assert "checkpointing changed the loss or gradients (dropout=0.1" in text(case)
    assert cases[cell("rng")][GRADIENTS.format(0.0)].is_passed


def test_a_counter_bumped_inside_a_function_unit_is_caught(forms_run):
    """Without `body_calls()` no int is excused as the layer counter: recompute's bump is a difference."""
    cases, _ = forms_run
    case = cases[cell("counter")][ATTRIBUTES]
    assert case.is_failure, text(case)
    assert "module attribute layer_runs: 12 vs 6" in text(case)


def test_a_declared_compute_dtype_is_compared_and_labelled_at_that_precision(forms_run):
    cases, properties = forms_run
    tests = cases[cell("bf16_compute")]
    assert tests[GRADIENTS.format(0.0)].is_passed, text(tests[GRADIENTS.format(0.0)])
    label = properties[cell("bf16_compute")][f"grad_ckpt::{GRADIENTS.format(0.0)}::precision"]
    assert label.startswith("float32 params, bfloat16 compute, rtol=0.015625"), label
    plain = properties[cell("plain")][f"grad_ckpt::{GRADIENTS.format(0.0)}::precision"]
    assert plain == "float32, bit for bit", plain


def test_the_prefix_suffix_example_passes_as_a_user_runs_it(tmp_path):
    """examples/prefix_suffix: its own policy and three factories, built-in suite, ws1 and ws2 FSDP2."""
    project = Project(tmp_path)
    config = REPO / "examples" / "prefix_suffix" / "matrix.toml"
    done = project.torchmatrix(
        "run", "--torch", "system", "--config", str(config), "--reports", str(tmp_path / "out"), "--confirm-limit", "0"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    cases, _ = read_run(tmp_path, done)
    assert sorted(cases) == ["ws1-none", "ws2-fsdp2"]
    for tests in cases.values():
        assert tests[RECOMPUTE].is_passed and tests[MICRO_BATCHES].is_passed, {n: text(c) for n, c in tests.items()}
        assert tests[GRADIENTS.format(0.1)].is_passed, text(tests[GRADIENTS.format(0.1)])
