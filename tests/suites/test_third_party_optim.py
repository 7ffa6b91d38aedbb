"""A small selection of examples/optimizers (nox -s optim_matrix) on CPU, through the real CLI:
torch-optimi's Kahan AdamW and torchao's AdamW8bit at two ranks with FSDP2 pass both suites
(but torchao's 2->1 reshard) with quantized state compared through the default state adapter; a
checkpointer that drops each library family's scale or compensation (or keeps only rank 0's
load) fails resume right after the load, and optimi listed as quantized fails the guard. All in
one run: axis `variant` picks model and checkpointer per cell, `third_party` being the example's
own. The full matrix and its table are in docs/how-to/third-party-optimizers.md."""

from __future__ import annotations

import importlib.util

import pytest

from torchmatrix.matrix.config import load_matrix

from helpers.checkout import REPO
from helpers.matrix_files import include_table, matrix_toml
from helpers.run_results import cell_failures, run_suites

pytestmark = pytest.mark.slow

OPTIMIZERS = load_matrix(REPO / "examples" / "optimizers" / "matrix.toml")
STATE_AFTER_LOAD = "test_state_restored_right_after_load[piece=optimizer_state]"
RESHARD_SHRINK = "test_reshard_load_is_exact[model_kind=model,reshard=shrink]"


# The example's own cells, run through both suites: name -> (its package, optimizer, cell, variant).
# Listed first, they run dtensor_optim for every cell of their world size, FSDP and optimizer.
AS_THEY_ARE = {
    "torchao": ("torchao", "ao_adamw8bit", "ws2-fsdp2", "third_party"),
    "optimi": ("optimi", "optimi_adamw_kahan", "ws2-fsdp2", "third_party"),
}
# Resume's mutants beside them: axis `variant` picks the model and the checkpointer per cell
# (tests/suites/resume_variants.py), so one rank pool per world size serves them all.
# mutant -> (its package, optimizer, cell, variant)
MUTANTS = {
    "torchao_scale_dropped": ("torchao", "ao_adamw8bit", "ws1-none", "torchao_scale_dropped"),
    "bitsandbytes_absmax_dropped": ("bitsandbytes", "bnb_adamw8bit", "ws1-none", "bitsandbytes_absmax_dropped"),
    "optimi_kahan_dropped": ("optimi", "optimi_adamw_kahan", "ws1-none", "optimi_kahan_dropped"),
    "rank_zero_only": ("optimi", "optimi_adamw_kahan", "ws2-fsdp2", "third_party_rank_zero_only"),
}
# optimi's factory under a name `quantized_state_optimizers` lists: its state is plain, so the guard must fail.
LISTED_QUANTIZED = "optimi_listed_quantized"
GUARD = ("optimi", LISTED_QUANTIZED, "ws1-none", "third_party")


def planned_cells() -> dict[str, tuple[str, str, str, str]]:
    """The shared run's cells whose package is installed: cell id -> (package, optimizer, cell, variant)."""
    planned = {}
    for package, optimizer, cell, variant in [*AS_THEY_ARE.values(), *MUTANTS.values(), GUARD]:
        if importlib.util.find_spec(package) is not None:
            planned[cell_id(package, optimizer, cell, variant)] = (package, optimizer, cell, variant)
    return planned


def shared_matrix(cells) -> str:
    """resume over exactly `cells` (planned_cells' values), dtensor_optim once per world size, FSDP
    and optimizer among them, with examples/optimizers' components and options, `LISTED_QUANTIZED`
    listed as quantized."""
    options = dict(OPTIMIZERS.suites["resume"].table)
    options["quantized_state_optimizers"] = [*options["quantized_state_optimizers"], LISTED_QUANTIZED]
    options["bf16_param_optimizers"] = [*options["bf16_param_optimizers"], LISTED_QUANTIZED]
    matrix = matrix_toml(
        axes={
            "world_size": [1],
            "fsdp": ["none"],
            "attn": ["sdpa"],
            "optimizer": ["optimi_adamw_kahan"],
            "variant": ["third_party"],
        },
        exclude=[{"variant": "third_party"}],
        suites={
            "resume": {"timeout": 300, "axes": ["world_size", "fsdp", "optimizer", "variant"], "options": options},
            "dtensor_optim": {
                "timeout": 300,
                "axes": ["world_size", "fsdp", "optimizer"],
                "options": OPTIMIZERS.suites["dtensor_optim"].table,
            },
        },
        components={
            **OPTIMIZERS.components,
            "model": "resume_variants:build_model",
            "checkpointer": "resume_variants:Checkpointer",
            f"optimizer_{LISTED_QUANTIZED}": OPTIMIZERS.components["optimizer_optimi_adamw_kahan"],
        },
    )
    for _, optimizer, cell, variant in cells:
        world_size, fsdp = cell.split("-")
        size = int(world_size.removeprefix("ws"))
        matrix += include_table(
            {"world_size": size, "fsdp": fsdp, "attn": "sdpa", "optimizer": optimizer, "variant": variant}
        )
    return matrix


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory):
    """The one run of the example's cells, every mutant and the guard whose package is here: the
    process, outcomes, failures."""
    root = tmp_path_factory.mktemp("shared")
    cells = planned_cells()
    done, outcomes = run_suites(root, shared_matrix(cells.values()), REPO / "tests" / "suites", timeout=1800)
    assert set(outcomes) == set(cells), done.stdout + done.stderr
    return done, outcomes, cell_failures(root / "reports" / "latest" / "torch-system")


def cell_id(package: str, optimizer: str, cell: str, variant: str) -> str:
    """The shared run's id of the cell an entry of AS_THEY_ARE, MUTANTS (or GUARD) names."""
    return f"{cell}-sdpa-{optimizer}-{variant}"


def test_optimi_kahan_and_torchao_8bit_as_they_are(shared_run):
    """Both resume exactly and keep DTensor state laid out like the param at ws2-FSDP2 (the ws1
    cells are the mutants'); torchao's 2->1 reshard load is not exact: state kept plain fp32 on 2
    ranks (under 4096 elements per rank) is quantized when loaded into 1 rank."""
    pytest.importorskip("torchao")
    pytest.importorskip("optimi")
    done, outcomes, failures = shared_run
    cells = {name: cell_id(*AS_THEY_ARE[name]) for name in AS_THEY_ARE}
    assert outcomes[cells["torchao"]]["test_rebuilt_run_starts_from_other_weights"] == "passed"
    for cell in cells.values():  # both suites ran there
        assert {"test_rebuilt_run_starts_from_other_weights", RESHARD_SHRINK} <= set(outcomes[cell]), outcomes
    failed = {
        (cell, test)
        for cell in cells.values()
        for test, outcome in outcomes[cell].items()
        if outcome not in ("passed", "skipped")
    }
    assert failed == {(cells["torchao"], RESHARD_SHRINK)}, done.stdout
    message = failures[cells["torchao"]][RESHARD_SHRINK]
    assert (
        "tensors differ after load: optimizer.embed.weight.exp_avg: " in message and "elements differ, max" in message
    )


@pytest.mark.parametrize("mutant", [name for name in MUTANTS if name != "rank_zero_only"])
def test_resume_catches_a_checkpointer_that_drops_the_scale(shared_run, mutant):
    pytest.importorskip(MUTANTS[mutant][0])
    done, outcomes, failures = shared_run
    cell = cell_id(*MUTANTS[mutant])
    assert done.returncode == 1, done.stdout + done.stderr
    assert outcomes[cell][STATE_AFTER_LOAD] == "failure", outcomes
    assert "after load: optimizer state " in failures[cell][STATE_AFTER_LOAD]


def test_resume_catches_a_checkpointer_that_loads_only_rank_zeros_shard(shared_run):
    pytest.importorskip("optimi")
    done, outcomes, failures = shared_run
    cell = cell_id(*MUTANTS["rank_zero_only"])
    assert outcomes[cell][STATE_AFTER_LOAD] == "failure", outcomes
    assert "rank 1: after load: optimizer state " in failures[cell][STATE_AFTER_LOAD], failures[cell]


def test_an_optimizer_listed_as_quantized_whose_state_is_plain_fails_the_guard(shared_run):
    """optimi keeps plain bf16/fp32 state: listed in `quantized_state_optimizers`, its cell must
    fail the suite's guard rather than pass on unquantized state."""
    pytest.importorskip("optimi")
    done, outcomes, failures = shared_run
    cell = cell_id(*GUARD)
    guard = "test_rebuilt_run_starts_from_other_weights"
    assert outcomes[cell][guard] == "failure", outcomes
    assert "hold no quantized optimizer state at the checkpoint step" in failures[cell][guard]
