"""dtensor_optim's reshard on examples/lightning: Fabric builds its mesh over the whole default group,
so each side of the reshard runs in a world of its own (a rank pool of 2, then of 1, and back), where
`fabric.save` / `fabric.load` reshard the FSDP2 checkpoint, every tensor is compared after the load,
and the two steps after it equal the run that never stopped. One cell, the stack's own model.

Needs lightning (`pip install lightning==2.6.6`, which `nox -s tests` installs); without it the test
skips saying so."""

from __future__ import annotations

import importlib.util

import pytest
from junitparser import JUnitXml

from torchmatrix.matrix.config import load_matrix

from helpers.checkout import REPO
from helpers.matrix_files import matrix_toml
from helpers.run_results import run_suites

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("lightning") is None,
        reason="needs lightning: pip install lightning==2.6.6 (nox -s tests installs it)",
    ),
]

EXAMPLE = REPO / "examples" / "lightning"
RESHARDS = {
    f"test_reshard_load_is_exact[model_kind=model,reshard={reshard}]": pair
    for reshard, pair in (("shrink", "2->1"), ("grow", "1->2"))
}


def test_fabric_reshards_in_worlds_of_their_own_and_trains_on_as_if_it_never_stopped(tmp_path):
    lightning = load_matrix(EXAMPLE / "matrix.toml")
    matrix = matrix_toml(
        axes={"world_size": [2], "fsdp": ["fsdp2"], "optimizer": ["adamw"]},
        suites={"dtensor_optim": {"timeout": 300, "axes": ["world_size", "fsdp", "optimizer"]}},
        components=lightning.components,
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
