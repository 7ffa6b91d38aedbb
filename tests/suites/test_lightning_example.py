"""One cell of examples/lightning (nox -s lightning_matrix) on CPU, through the real CLI: grad_ckpt on
Fabric's FSDPStrategy with its own activation checkpointing, the suites handed the `_FabricModule`
(FSDP1 found beneath it, issue 60); resume on
Lightning Fabric's FSDPStrategy at world size 2, the loss and `fabric.backward` taken from the
example's `training_step` component (a plain `loss.backward()` is refused under FSDPStrategy), and
the real Lightning bug the suites found kept red: the sharded `Fabric.load` leaves the scheduler
and the loader as built (examples/lightning/prove_load_bug.py shows it without torchmatrix). And
dtensor_optim's reshard at world size 2: Fabric builds its mesh over the whole default group, so
each side runs in a world of its own, where `fabric.save` / `fabric.load` reshard the FSDP2
checkpoint and the two steps after the load equal the run that never stopped.

Needs lightning (`pip install lightning==2.6.6`, which `nox -s tests` installs); without it the
test skips saying so. The whole matrix and what it finds: docs/how-to/lightning.md."""

from __future__ import annotations

import importlib.util

import pytest
from junitparser import JUnitXml

from torchmatrix.matrix.config import load_matrix

from helpers.checkout import REPO
from helpers.matrix_files import matrix_toml
from helpers.run_results import cell_failures, run_suites

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("lightning") is None,
        reason="needs lightning: pip install lightning==2.6.6 (nox -s tests installs it)",
    ),
]

EXAMPLE = REPO / "examples" / "lightning"
LIGHTNING = load_matrix(EXAMPLE / "matrix.toml")
CELL = "ws2-fsdp1-adamw"
AFTER_LOAD = "test_state_restored_right_after_load[piece={}]"
LOST = {
    AFTER_LOAD.format("scheduler"): "rank 0: after load: scheduler last_epoch is 0, saved 4",
    AFTER_LOAD.format("loader"): "rank 0: after load: loader would yield batch 0, saved at batch 4",
    "test_losses_identical_after_resume": "loss at step 5 (resumed at 4)",
    "test_final_parameters_identical": "final parameters, straight vs resumed",
    "test_final_optimizer_state_identical": "final optimizer state, straight vs resumed",
}


def test_resume_names_what_the_sharded_fabric_load_leaves_as_built(tmp_path):
    resume = LIGHTNING.suites["resume"]
    matrix = matrix_toml(
        axes={"world_size": [2], "fsdp": ["fsdp1"], "optimizer": ["adamw"]},
        suites={"resume": {"timeout": 300, "axes": resume.axes, "options": resume.table}},
        components=LIGHTNING.components,
    )
    done, outcomes = run_suites(tmp_path, matrix, EXAMPLE)
    assert done.returncode == 1, done.stdout + done.stderr
    failed = {test for test, outcome in outcomes[CELL].items() if outcome in ("failure", "error")}
    assert failed == set(LOST), outcomes[CELL]
    messages = cell_failures(tmp_path / "reports" / "latest" / "torch-system")[CELL]
    for test, line in LOST.items():
        assert line in messages[test], messages[test]
    for piece in ("parameters", "optimizer_state", "param_groups"):
        assert outcomes[CELL][AFTER_LOAD.format(piece)] == "passed", outcomes[CELL]


RESHARDS = {
    f"test_reshard_load_is_exact[model_kind=model,reshard={reshard}]": pair
    for reshard, pair in (("shrink", "2->1"), ("grow", "1->2"))
}


def test_fabric_reshards_in_worlds_of_their_own_and_trains_on_as_if_it_never_stopped(tmp_path):
    matrix = matrix_toml(
        axes={"world_size": [2], "fsdp": ["fsdp2"], "optimizer": ["adamw"]},
        suites={"dtensor_optim": {"timeout": 300, "axes": ["world_size", "fsdp", "optimizer"]}},
        components=LIGHTNING.components,
    )
    done, outcomes = run_suites(tmp_path, matrix, EXAMPLE, tests=[f"dtensor_optim::{test}" for test in RESHARDS])
    assert done.returncode == 0, done.stdout + done.stderr
    assert outcomes == {"ws2-fsdp2-adamw": dict.fromkeys(RESHARDS, "passed")}, outcomes
    junit = JUnitXml.fromfile(str(tmp_path / "reports" / "latest" / "junit.xml"))
    properties = {
        prop.name.split("::", 1)[1]: prop.value for suite in junit for prop in suite.properties() if "::" in prop.name
    }
    for test, pair in RESHARDS.items():
        assert properties[f"{test}::reshard_source"] == "checkpointer"
        assert properties[f"{test}::reshard_worlds"].startswith("worlds of their own"), properties
        assert "parallel:parallelize takes no `mesh`" in properties[f"{test}::reshard_worlds"]
        compared = int(properties[f"{test}::reshard_tensors_compared"])
        assert compared > 0 and properties[f"{test}::reshard_continued"] == (
            f"{pair}: 2 steps, {compared} tensors and every loss compared bit for bit"
        ), properties


GRAD_CKPT = (
    "test_checkpointing_leaves_loss_and_gradients_unchanged[dropout=0.0]",
    "test_checkpointing_leaves_loss_and_gradients_unchanged[dropout=0.1]",
    "test_recompute_reruns_layers_and_rewrites_cache_identically",
)


def test_grad_ckpt_runs_on_the_fabric_module_under_fsdp1(tmp_path):
    matrix = matrix_toml(
        axes={"world_size": [2], "fsdp": ["fsdp1"], "optimizer": ["adamw"]},
        suites={"grad_ckpt": {"timeout": 300, "axes": LIGHTNING.suites["grad_ckpt"].axes}},
        components=LIGHTNING.components,
    )
    done, outcomes = run_suites(tmp_path, matrix, EXAMPLE, tests=[f"grad_ckpt::{test}" for test in GRAD_CKPT])
    assert done.returncode == 0, done.stdout + done.stderr
    assert outcomes[CELL] == {**dict.fromkeys(GRAD_CKPT[:2], "passed"), GRAD_CKPT[2]: "skipped"}, outcomes
