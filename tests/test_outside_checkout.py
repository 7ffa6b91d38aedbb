"""A user's own repository, outside this checkout: torchmatrix pip-installed (not editable) into a
fresh venv, a matrix.toml naming built-in suites by name beside a suite of the user's own, and
the user's components in their own package. `torchmatrix run` and `report` are all it takes.
torch there is a fake release of the tests' own (tests/helpers/fake_releases.py): unpacking the real
wheel into one more venv would prove nothing about how torchmatrix installs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.checkout import copy_checkout, unconstrained_pip
from helpers.fake_releases import fake_torch_wheel, torch_site

pytestmark = pytest.mark.slow

MATRIX = """
[torch]
versions = ["system"]

[axes]
world_size = [1, 2]
fsdp = ["none", "fsdp2"]

[[exclude]]
fsdp = "none"
world_size = 2

[[exclude]]
fsdp = "fsdp2"
world_size = 1

[suites.collectives]
[suites.grad_ckpt]

[suites.mine]
path = "suites/test_mine.py"
timeout = 60
axes = ["world_size"]

[components]
model = "mystack.model:build_model"
batch = "torchmatrix.models.transformer:make_batch"
parallelize = "torchmatrix.models.parallel:parallelize"
"""

USER_MODEL = '''
"""The user's model factory: the reference decoder, with sdpa attention where the cell does not say."""

from torchmatrix.models import transformer


def build_model(cell, **options):
    return transformer.build_model({"attn": "sdpa", **cell}, **options)
'''

# The user's own `suites` package, beside torchmatrix's built-in suites in one pytest process.
USER_SUITE = """
from mystack.model import build_model
from suites.helpers import layer_count


def test_the_users_model_builds(cell):
    assert layer_count(build_model(cell)) > 1
"""

USER_HELPERS = """
def layer_count(model):
    return sum(1 for _ in model.modules())
"""


def write_user_repository(root: Path) -> Path:
    files = {
        "matrix.toml": MATRIX,
        "mystack/__init__.py": "",
        "mystack/model.py": USER_MODEL,
        "suites/__init__.py": "",
        "suites/helpers.py": USER_HELPERS,
        "suites/test_mine.py": USER_SUITE,
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text).lstrip())
    return root


def test_a_users_repository_runs_builtin_suites_and_its_own(tmp_path):
    checkout = copy_checkout(tmp_path / "torchmatrix-src")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    environ = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    torch_release = fake_torch_wheel(tmp_path / "releases", "2.13.0", torch_site())
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", str(torch_release), str(checkout)],
        env=unconstrained_pip(environ),
        check=True,
        capture_output=True,
    )
    shutil.rmtree(checkout)  # the install must not lean on the source tree
    user = write_user_repository(tmp_path / "user-repo")
    torchmatrix = str(venv / "bin" / "torchmatrix")

    run = subprocess.run(
        [torchmatrix, "run", "--config", "matrix.toml", "--torch", "system"],
        cwd=user,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = subprocess.run([torchmatrix, "report"], cwd=user, env=environ, capture_output=True, text=True)
    assert report.returncode == 0, report.stdout + report.stderr

    latest = (user / "reports" / "latest").resolve()
    for name in ("junit.xml", "results.json", "summary.md", "summary.html"):
        assert (latest / name).is_file(), name
    results = json.loads((latest / "results.json").read_text())
    outcomes = {(test["suite"], test["cell"], test["test"]): test["status"] for test in results["tests"]}
    assert {suite for suite, _, _ in outcomes} == {"collectives", "grad_ckpt", "mine"}, outcomes
    assert {cell for _, cell, _ in outcomes} == {"ws1-none", "ws2-fsdp2"}, outcomes
    twin = {
        key: status
        for key, status in outcomes.items()
        if key[2].startswith(("test_compiled_steps_match_their_eager_twin", "test_forward_at_another_length"))
    }
    assert set(twin.values()) == {"skipped"}, outcomes  # eager cells: no compiled step, no graph per length
    assert {status for key, status in outcomes.items() if key not in twin} == {"passed"}, outcomes
