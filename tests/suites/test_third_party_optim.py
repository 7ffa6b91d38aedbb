"""A small selection of examples/optimizers (nox -s optim_matrix) on CPU, through the real CLI:
torch-optimi's Kahan AdamW and torchao's AdamW8bit at two ranks with FSDP2 pass both suites
(but torchao's 2->1 reshard) with quantized state compared through the default state adapter; a
checkpointer that drops each library family's scale or compensation (or keeps only rank 0's
load) fails resume right after the load. The full matrix and its table are in docs/how-to/third-party-optimizers.md."""

from __future__ import annotations

import pytest

from torchmatrix.matrix.config import load_matrix

from helpers.checkout import REPO
from helpers.matrix_files import matrix_toml
from helpers.run_results import cell_failures, run_suites

pytestmark = pytest.mark.slow

OPTIMIZERS = load_matrix(REPO / "examples" / "optimizers" / "matrix.toml")
EXCLUDE = [{"fsdp": "none", "world_size": 2}, {"fsdp": "fsdp2", "world_size": 1}]
STATE_AFTER_LOAD = "test_state_restored_right_after_load[piece=optimizer_state]"


def third_party_matrix(
    optimizers: list[str], suites: tuple[str, ...], cells=("ws1-none", "ws2-fsdp2"), **overrides: str
) -> str:
    """`cells` (ws1 without FSDP, ws2 with FSDP2) over `optimizers`, with examples/optimizers' components and options."""
    world_sizes = [int(cell.split("-")[0].removeprefix("ws")) for cell in cells]
    fsdp = [cell.split("-")[1] for cell in cells]
    return matrix_toml(
        axes={"world_size": world_sizes, "fsdp": fsdp, "attn": ["sdpa"], "optimizer": optimizers},
        exclude=[rule for rule in EXCLUDE if rule["fsdp"] in fsdp and rule["world_size"] in world_sizes],
        suites={
            name: {
                "timeout": 300,
                "axes": ["world_size", "fsdp", "optimizer"],
                "options": OPTIMIZERS.suites[name].options,
            }
            for name in suites
        },
        components={**OPTIMIZERS.components, **overrides},
    )


RESHARD_SHRINK = "test_reshard_load_is_exact[model_kind=model,reshard=shrink]"


def test_optimi_kahan_and_torchao_8bit_as_they_are(tmp_path):
    """Both resume exactly and keep DTensor state laid out like the param at ws2-FSDP2 (ws1 is the
    mutants' cell below);
    torchao's 2->1 reshard load is not exact: state kept plain fp32 on 2 ranks (under 4096
    elements per rank) is quantized when loaded into 1 rank."""
    pytest.importorskip("torchao")
    pytest.importorskip("optimi")
    optimizers = ["optimi_adamw_kahan", "ao_adamw8bit"]
    done, outcomes = run_suites(tmp_path, third_party_matrix(optimizers, ("resume", "dtensor_optim"), ("ws2-fsdp2",)))
    assert set(outcomes) == {f"ws2-fsdp2-sdpa-{o}" for o in optimizers}
    assert outcomes["ws2-fsdp2-sdpa-ao_adamw8bit"]["test_rebuilt_run_starts_from_other_weights"] == "passed"
    failed = {
        (cell, test) for cell, tests in outcomes.items() for test, outcome in tests.items() if outcome != "passed"
    }
    skipped = {(cell, test) for cell, test in failed if outcomes[cell][test] == "skipped"}
    assert failed - skipped == {("ws2-fsdp2-sdpa-ao_adamw8bit", RESHARD_SHRINK)}, done.stdout
    message = cell_failures(tmp_path / "reports" / "latest" / "torch-system")["ws2-fsdp2-sdpa-ao_adamw8bit"]
    assert "tensors differ after load: optimizer.embed.weight.exp_avg: values differ" in message[RESHARD_SHRINK]


MUTANTS = {
    "torchao_scale_dropped": ("torchao", "ao_adamw8bit", "ws1-none", "TorchaoScaleDroppedCheckpointer"),
    "bitsandbytes_absmax_dropped": ("bitsandbytes", "bnb_adamw8bit", "ws1-none", "BnbAbsmaxDroppedCheckpointer"),
    "optimi_kahan_dropped": ("optimi", "optimi_adamw_kahan", "ws1-none", "KahanCompensationDroppedCheckpointer"),
}


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_resume_catches_a_checkpointer_that_drops_the_scale(tmp_path, mutant):
    package, optimizer, cell, checkpointer = MUTANTS[mutant]
    pytest.importorskip(package)
    text = third_party_matrix(
        [optimizer], ("resume",), (cell,), checkpointer=f"torchmatrix.models.mutants.quantized_state:{checkpointer}"
    )
    done, outcomes = run_suites(tmp_path, text)
    cell_id = f"{cell}-sdpa-{optimizer}"
    assert done.returncode == 1, done.stdout + done.stderr
    assert outcomes[cell_id][STATE_AFTER_LOAD] == "failure", outcomes
    assert (
        "after load: optimizer state "
        in cell_failures(tmp_path / "reports" / "latest" / "torch-system")[cell_id][STATE_AFTER_LOAD]
    )


def test_resume_catches_a_checkpointer_that_loads_only_rank_zeros_shard(tmp_path):
    pytest.importorskip("optimi")
    text = third_party_matrix(
        ["optimi_adamw_kahan"],
        ("resume",),
        ("ws2-fsdp2",),
        checkpointer="torchmatrix.models.mutants.resume:RankZeroOnlyCheckpointer",
    )
    done, outcomes = run_suites(tmp_path, text)
    assert done.returncode == 1, done.stdout + done.stderr
    failures = cell_failures(tmp_path / "reports" / "latest" / "torch-system")["ws2-fsdp2-sdpa-optimi_adamw_kahan"]
    assert "rank 1: after load: optimizer state " in failures[STATE_AFTER_LOAD], failures


def test_an_optimizer_listed_as_quantized_whose_state_is_plain_fails_the_guard(tmp_path):
    """optimi keeps plain bf16/fp32 state: listed in `quantized_state_optimizers`, its cell must
    fail the suite's guard rather than pass on unquantized state."""
    pytest.importorskip("optimi")
    text = third_party_matrix(["optimi_adamw_kahan"], ("resume",), ("ws1-none",))
    text = text.replace("quantized_state_optimizers = [", 'quantized_state_optimizers = ["optimi_adamw_kahan", ')
    done, outcomes = run_suites(tmp_path, text)
    assert done.returncode == 1, done.stdout + done.stderr
    guard = "test_rebuilt_run_starts_from_other_weights"
    assert outcomes["ws1-none-sdpa-optimi_adamw_kahan"][guard] == "failure", outcomes
    message = cell_failures(tmp_path / "reports" / "latest" / "torch-system")["ws1-none-sdpa-optimi_adamw_kahan"][guard]
    assert "hold no quantized optimizer state at the checkpoint step" in message
