"""The grad-ckpt suite passes on the reference model and fails on each of its mutants.

One real `python -m torchmatrix run --torch system`, shared by the tests here, over CPU cells at world
sizes 1 and 2: axis `variant` picks the model per cell (tests/suites/grad_ckpt_variants.py), so one
rank pool per world size serves the reference and every mutant. The reference runs in every cell
(fsdp none / fsdp1 / fsdp2 by sdpa and eager); each mutant in one cell per fsdp kind, the kind that
changes how the suite sees parameters, gradients and state, with both attentions among them. The
reference also runs alone in bfloat16 on two cells, where the derived tolerance must hold. The mutants
whose failure names layer 0 and nothing across the stack build one layer a stack
(grad_ckpt_variants.ONE_LAYER); the reference and the rest, three.
"""

from __future__ import annotations

import pytest

from helpers.checkout import REPO
from helpers.grad_ckpt_runs import (
    ATTRIBUTES,
    BUFFERS,
    COMPILED_ONLY,
    EVERY_TEST,
    GRADIENTS,
    MICRO_BATCHES,
    RECOMPUTE,
    REFERENCE,
    failure_text,
    passed_in_an_eager_cell,
    run_suite,
)
from helpers.matrix_files import include_table, matrix_toml

pytestmark = pytest.mark.slow

CELLS = ["ws1-none-sdpa", "ws1-none-eager", "ws2-fsdp1-sdpa", "ws2-fsdp1-eager", "ws2-fsdp2-sdpa", "ws2-fsdp2-eager"]
# One cell per fsdp kind, both attentions among them: a mutant's cache, buffer, RNG or gradient change
# does not depend on the attention kernel, and every cell kind still runs the reference.
MUTANT_CELLS = ["ws1-none-sdpa", "ws2-fsdp1-eager", "ws2-fsdp2-sdpa"]
SDPA_CELLS = ["ws1-none-sdpa", "ws2-fsdp1-sdpa", "ws2-fsdp2-sdpa"]
TWO_CELLS = ["ws1-none-sdpa", "ws2-fsdp2-sdpa"]


def grad_ckpt_matrix(
    model: str, *, dtype: str = "float32", fsdp: tuple[str, ...] = ("none", "fsdp1", "fsdp2"), attn=("sdpa", "eager")
) -> str:
    """ws1 without FSDP and ws2 with the other fsdp values, with these attentions, this model and dtype."""
    return matrix_toml(
        torch=["2.13.0"],
        axes={"world_size": [1, 2], "fsdp": list(fsdp), "attn": list(attn)},
        exclude=[{"fsdp": "none", "world_size": 2}, {"fsdp": [f for f in fsdp if f != "none"], "world_size": 1}],
        suites={
            "grad_ckpt": {
                "path": None,
                "timeout": 120,
                "axes": ["world_size", "fsdp", "attn"],
                "options": {"dtype": dtype},
            }
        },
        components={
            "model": model,
            "parallelize": "torchmatrix.models.parallel:parallelize",
            "batch": "torchmatrix.models.transformer:make_batch",
        },
    )


def variants_matrix(cells: dict[str, list[str]]) -> str:
    """grad_ckpt over exactly these cells: variant (a factory name of models/mutants/grad_ckpt.py, or
    `reference`) -> its cell ids ws<N>-<fsdp>-<attn>, as includes of an empty product."""
    matrix = matrix_toml(
        torch=["2.13.0"],
        axes={"world_size": [1], "fsdp": ["none"], "attn": ["sdpa"], "variant": ["reference"]},
        exclude=[{"variant": "reference"}],
        suites={"grad_ckpt": {"path": None, "timeout": 120, "axes": ["world_size", "fsdp", "attn", "variant"]}},
        components={
            "model": "grad_ckpt_variants:build_model",
            "parallelize": "torchmatrix.models.parallel:parallelize",
            "batch": "torchmatrix.models.transformer:make_batch",
        },
    )
    for variant, ids in cells.items():
        for cell in ids:
            world_size, fsdp, attn = cell.split("-")
            entry = {"world_size": int(world_size.removeprefix("ws")), "fsdp": fsdp, "attn": attn, "variant": variant}
            matrix += include_table(entry)
    return matrix


def factory(path: str) -> str:
    """A mutant's factory name, its `variant` value."""
    return path.rsplit(":", 1)[1]


# mutant factory -> (tests that must fail in every cell, text each failure must contain, or several: the
# conclusion, the evidence, the fix)
MUTANTS = {
    "torchmatrix.models.mutants.grad_ckpt:appending_cache_model": (
        [GRADIENTS.format(0.0), GRADIENTS.format(0.1), RECOMPUTE],
        # torch's CheckpointError names no layer; the suite names the one whose recompute raised it
        "backward with activation checkpointing (did a recomputed layer differ from its forward?) failed: "
        'RuntimeError("in the recompute of layer prefix_layers.2 (',
    ),
    "torchmatrix.models.mutants.grad_ckpt:reappending_cache_model": (
        [RECOMPUTE],
        # the conclusion first, naming the units whose recompute wrote the entries; the evidence under it
        (
            "after backward the cache has 12 entries, forward left 6: recompute wrote past_key_values[0][2], [0][3], "
            "[1][2], [1][3], [2][2], [2][3] again (units prefix_layers.0.body, prefix_layers.1.body, prefix_layers.2.body)",
            "rank 0: cache entry past_key_values[0][2]: missing from the second (with checkpointing; after backward first",
            "usual fix: a checkpointed layer must leave the cache as one run of it does",
        ),
    ),
    "torchmatrix.models.mutants.grad_ckpt:cache_copy_model": (
        [RECOMPUTE],
        "could not observe recompute writing the cache",
    ),
    "torchmatrix.models.mutants.grad_ckpt:later_layer_cache_model": (
        [GRADIENTS.format(0.0), GRADIENTS.format(0.1)],
        "checkpointing changed the loss or gradients",
    ),
    "torchmatrix.models.mutants.grad_ckpt:rng_forgetting_model": (
        [GRADIENTS.format(0.1)],
        "checkpointing changed the loss or gradients (dropout=0.1",
    ),
    "torchmatrix.models.mutants.grad_ckpt:buffer_counting_model": (
        [BUFFERS],
        "buffer prefix_layers.0.body_runs: 2 vs 1",
    ),
    "torchmatrix.models.mutants.grad_ckpt:cache_counter_model": (
        [RECOMPUTE],
        "cache state past_key_values.writes: 6 vs 3 (after backward; with checkpointing first, without second)",
    ),
    # Without dropout: with it, FSDP1's averaging reduce-scatter can round a one-ULP change of one
    # rank's element away (seen in ws2-fsdp1-eager), so that variant proves nothing either way.
    "torchmatrix.models.mutants.grad_ckpt:last_bit_gradient_model": (
        [GRADIENTS.format(0.0)],
        # one element moved by one ULP; FSDP1's reduce-scatter can carry it as 2 ULP (ws2-fsdp1-eager)
        "gradient of prefix_layers.0.o_proj.weight: 1/1024 elements differ, max ",
    ),
}


LACKING = "no_cache_no_dropout_model"
NEVER = "never_checkpointing_model"


# State the single forward→backward comparison cannot see; one sdpa cell per fsdp value.
STATE_MUTANTS = {
    "torchmatrix.models.mutants.grad_ckpt:module_held_cache_model": (
        MICRO_BATCHES,
        "with 2 micro-batches forward before one backward, checkpointing changed the loss or gradients",
    ),
    "torchmatrix.models.mutants.grad_ckpt:aux_loss_list_model": (
        ATTRIBUTES,
        "rank 0: module attribute prefix_layers.1.aux_losses: 2 entries vs 1",
        # an object of the user's class on the layer, and a registry at module level
        "rank 0: module attribute prefix_layers.1.routing_stats.tokens_routed: ",
        "rank 0: module attribute torchmatrix.models.mutants.grad_ckpt.AUX_LOSS_TRACKER['prefix layer 1']: 2 entries vs 1",
    ),
}

VARIANT_CELLS = {
    "reference": CELLS,
    **{factory(mutant): MUTANT_CELLS for mutant in MUTANTS},
    **{factory(mutant): SDPA_CELLS for mutant in STATE_MUTANTS},
    LACKING: TWO_CELLS,
    NEVER: TWO_CELLS,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The one run: every variant in its cells; exit code, {variant: {cell: {test: testcase}}}, output."""
    root = tmp_path_factory.mktemp("grad_ckpt_variants")
    project_dir = root / "project"
    project_dir.mkdir()
    (project_dir / "grad_ckpt_variants.py").symlink_to(REPO / "tests" / "suites" / "grad_ckpt_variants.py")
    returncode, cases, output, properties = run_suite(project_dir, variants_matrix(VARIANT_CELLS))
    by_variant: dict[str, dict[str, dict[str, object]]] = {}
    for cell_id, tests in cases.items():
        cell, _, variant = cell_id.rpartition("-")
        by_variant.setdefault(variant, {})[cell] = tests
    return returncode, by_variant, output, properties


def test_the_run_has_every_planned_cell_and_fails(run):
    returncode, by_variant, output, _ = run
    assert returncode == 1, output
    assert {variant: sorted(cells) for variant, cells in by_variant.items()} == {
        variant: sorted(cells) for variant, cells in VARIANT_CELLS.items()
    }, output


def test_suite_passes_on_the_reference_model_in_every_cell(run):
    _, by_variant, output, properties = run
    assert sorted(by_variant["reference"]) == sorted(CELLS), output
    for cell, tests in by_variant["reference"].items():
        assert sorted(tests) == EVERY_TEST, cell
        assert not passed_in_an_eager_cell(tests), {cell: passed_in_an_eager_cell(tests)}
        ulps = {
            name: value for name, value in properties[f"{cell}-reference"].items() if name.endswith("::grad_max_ulp")
        }
        assert sorted(ulps) == [f"grad_ckpt::{GRADIENTS.format(d)}::grad_max_ulp" for d in (0.0, 0.1)], ulps
        assert set(ulps.values()) == {"0"}, ulps


@pytest.mark.parametrize("mutant", sorted(MUTANTS), ids=factory)
def test_suite_fails_on_each_mutant_in_one_cell_of_each_fsdp_kind(run, mutant):
    must_fail, reason = MUTANTS[mutant]
    _, by_variant, output, _ = run
    cases = by_variant[factory(mutant)]
    assert sorted(cases) == sorted(MUTANT_CELLS), output
    for cell in MUTANT_CELLS:
        for test in must_fail:
            case = cases[cell][test]
            assert case.is_failure, f"{mutant} not caught by {test} in {cell}"
            for text in (reason,) if isinstance(reason, str) else reason:
                assert text in failure_text(case), failure_text(case)
            assert f"cell {cell}-{factory(mutant)}" in failure_text(case), "the failure must name the cell"
            assert "assert not" not in failure_text(case), "no pytest repr of the problems trails the message"


@pytest.mark.parametrize("mutant", sorted(STATE_MUTANTS), ids=factory)
def test_suite_fails_on_state_it_could_not_see_before_in_every_fsdp_value(run, mutant):
    """A cache held on the module across calls (seen only with micro-batches) and a plain list attribute
    that recompute appends to (seen only by comparing module attributes): the one test that can see
    each fails, naming it; every other test passes, since the mutant is right for them."""
    must_fail, *reasons = STATE_MUTANTS[mutant]
    _, by_variant, output, _ = run
    cases = by_variant[factory(mutant)]
    assert sorted(cases) == SDPA_CELLS, output
    for cell, tests in cases.items():
        assert tests[must_fail].is_failure, f"{mutant} not caught by {must_fail} in {cell}"
        for reason in reasons:
            assert reason in failure_text(tests[must_fail]), failure_text(tests[must_fail])
        assert all(case.is_passed for test, case in tests.items() if test not in (must_fail, *COMPILED_ONLY)), cell


def test_reference_model_passes_in_bfloat16_within_the_derived_tolerance(tmp_path):
    matrix = grad_ckpt_matrix(REFERENCE, dtype="bfloat16", fsdp=("none", "fsdp2"), attn=("sdpa",))
    returncode, cases, output, _ = run_suite(tmp_path / "bf16", matrix)
    assert returncode == 0, output
    assert sorted(cases) == ["ws1-none-sdpa", "ws2-fsdp2-sdpa"], output
    for cell, tests in cases.items():
        assert sorted(tests) == EVERY_TEST, cell
        assert not passed_in_an_eager_cell(tests), {cell: passed_in_an_eager_cell(tests)}


def test_checks_a_model_lacks_skip_with_their_reason_and_never_pass(run):
    """A model with no cache and no dropout (torchtitan's Llama is one): the cache checks and the
    dropout variant skip saying what is missing; the checks it can feed still run and pass."""
    _, by_variant, output, _ = run
    assert sorted(by_variant[LACKING]) == TWO_CELLS, output
    for cell, tests in by_variant[LACKING].items():
        assert all(tests[test].is_passed for test in (GRADIENTS.format(0.0), BUFFERS, ATTRIBUTES, MICRO_BATCHES)), cell
        dropout, recompute = tests[GRADIENTS.format(0.1)], tests[RECOMPUTE]
        assert dropout.is_skipped and "dropout changed nothing: the model has none" in failure_text(dropout), cell
        assert recompute.is_skipped, f"{cell}: {failure_text(recompute)}"
        assert "the model returned no cache (an empty past_key_values" in failure_text(recompute), cell


def test_a_model_that_ignores_checkpointing_fails_instead_of_comparing_eager_with_eager(run):
    _, by_variant, output, _ = run
    assert sorted(by_variant[NEVER]) == TWO_CELLS, output
    for cell, tests in by_variant[NEVER].items():
        for test in (GRADIENTS.format(0.0), GRADIENTS.format(0.1)):
            assert tests[test].is_failure, f"{cell} {test}: {failure_text(tests[test])}"
            assert "no layer body ran again in backward" in failure_text(tests[test]), failure_text(tests[test])
        assert tests[RECOMPUTE].is_failure, cell
