"""`torchmatrix repro` of a cross_version read failure writes a torch-only script that writes with one
interpreter and reads with another, and whose exit 1 means only "the load failed": a side that cannot
import torch is "did not run" (exit 2). The suite reproducer keeps the same promise at collection.

The two interpreters are this venv's (torch 2.13.0) and a second "install" made in a second: a venv
without pip whose only package path is this torch's site-packages. pytest and torchmatrix are blocked
for the script (a PYTHONPATH entry whose modules raise), so it runs on torch alone.
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from torchmatrix.reports.machine_paths import without_machine_paths
from torchmatrix.reports.records import TestRecord
from torchmatrix.reports.results_json import write_json
from torchmatrix.reports.run_reader import load_results
from torchmatrix.repro.command import script_text
from torchmatrix.status import Confirmation

from helpers.checkout import checkout_env
from helpers.report_runs import BASELINE, CANDIDATE, write_fixture_run

HOSTILE = 'C:\\Users\\ci\\ckpt """ __import__("os").system("touch PWNED")'
READ = f"test_loads_checkpoint_written_by[writer={CANDIDATE}]"
FAILURE = f"{BASELINE}/ws1-none/cross_version::{READ}"
STDLIB = {"argparse", "json", "shutil", "subprocess", "sys", "tempfile", "traceback", "pathlib"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """The fixture run, plus a cross_version read of 2.14.1's checkpoint that failed on 2.13.0, confirmed."""
    root = tmp_path_factory.mktemp("cross")
    results = load_results(write_fixture_run(root / "project"))
    read = TestRecord(BASELINE, "ws1-none", "cross_version", READ, "failed", 1.0, message=HOSTILE,
                      confirmation=Confirmation.FAILS_ALONE)  # fmt: skip
    run = root / "project" / "reports" / "with-read"
    run.mkdir(parents=True)
    write_json(run / "results.json", dataclasses.replace(results, tests=[*results.tests, read]), [])
    return run


@pytest.fixture(scope="module")
def second_python(tmp_path_factory) -> str:
    """Another interpreter with torch and nothing of this project: a pip-less venv seeing torch's site-packages."""
    import torch

    venv = tmp_path_factory.mktemp("second") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (site / "torch_site.pth").write_text(f"{Path(torch.__file__).resolve().parents[1]}\n")
    return str(venv / "bin" / "python")


@pytest.fixture(scope="module")
def blocked(tmp_path_factory) -> dict[str, str]:
    """An environment where importing pytest or torchmatrix fails."""
    directory = tmp_path_factory.mktemp("blocked")
    for name in ("pytest", "torchmatrix", "_pytest"):
        (directory / f"{name}.py").write_text(f"raise ImportError('{name} is not for the reproducer')\n")
    return {**checkout_env(), "PYTHONPATH": str(directory)}


@pytest.fixture(scope="module")
def reproducer(run_dir, second_python, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("out") / "repro"
    done = subprocess.run(
        [sys.executable, "-m", "torchmatrix", "repro", str(run_dir), FAILURE, "--out", str(out),
         "--python", sys.executable, "--writer-python", second_python],
        env=checkout_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "it needs two Pythons, each with torch" in done.stdout and "no pytest, no torchmatrix" in done.stdout
    return out


def run_script(reproducer: Path, writer: str, reader: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "repro.py", "--writer", writer, "--reader", reader],
        cwd=reproducer, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_the_reproducer_is_torch_only_and_holds_the_failure_as_data(reproducer, second_python):
    script = (reproducer / "repro.py").read_text()
    tree = ast.parse(script)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= STDLIB | {"torch", "torch.distributed.checkpoint"}, imported
    (failure,) = [n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "FAILURE"]
    assert ast.literal_eval(failure)["root_cause"] == HOSTILE
    command = (reproducer / "command.txt").read_text()
    reader = without_machine_paths(sys.executable, None, Path.cwd())  # relative to the project, as the README says
    assert command == f"python repro.py --writer {second_python} --reader {reader}\n"
    readme = (reproducer / "README.md").read_text()
    assert f"# A checkpoint written by torch {CANDIDATE}+cpu cannot be loaded by torch {BASELINE}+cpu" in readme
    assert "no pytest, no torchmatrix" in readme and "checks the checkpoint format alone" in readme


@pytest.mark.slow
def test_it_passes_reproduces_or_did_not_run_and_says_which(reproducer, second_python, blocked, tmp_path):
    passed = run_script(reproducer, second_python, sys.executable, blocked)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    last = passed.stdout.splitlines()[-1]
    assert last.startswith(f"a checkpoint written by torch {BASELINE}") and last.endswith(": passed"), last

    corrupting = tmp_path / "corrupting-writer"  # a writer whose checkpoint the reader cannot read
    corrupting.write_text(f'#!/bin/sh\n{second_python} "$@" || exit $?\n[ "$2" = write ] && echo garbage > "$3/checkpoint/.metadata"\nexit 0\n')  # fmt: skip
    corrupting.chmod(0o755)
    failed = run_script(reproducer, str(corrupting), sys.executable, blocked)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert failed.stdout.splitlines()[-2].endswith(": FAILED") and failed.stdout.splitlines()[-1].startswith(
        "root cause: "
    )

    no_torch = tmp_path / "no-torch"  # a reader that installed but cannot import torch
    (no_torch / "torch").mkdir(parents=True)
    (no_torch / "torch" / "__init__.py").write_text(
        "raise ImportError('libcudart.so.13: cannot open shared object file')\n"
    )
    broken = run_script(
        reproducer, second_python, sys.executable, {**blocked, "PYTHONPATH": f"{no_torch}:{blocked['PYTHONPATH']}"}
    )
    assert broken.returncode == 2, broken.stdout + broken.stderr
    assert "did not run" in broken.stdout.splitlines()[-1] and "this is not the failure" in broken.stdout


def test_a_suite_reproducer_that_fails_at_collection_did_not_run(tmp_path):
    """Exit 1 is only a failing test: a suite that does not import is exit 2, never "reproduces"."""
    check = {"suite": "demo", "test": "test_x", "suite_file": "suites/test_demo.py", "cell_id": "ws1", "cell": {},
             "world_size": 1, "device": "cpu", "timeout": 60, "options": {}, "components": {}}  # fmt: skip
    record = TestRecord(BASELINE, "ws1", "demo", "test_x", "failed", 1.0, message="boom")
    sources = {"suites/__init__.py": "", "suites/test_demo.py": "from torchmatrix.testing import EXPECTED_FILE\n"}
    (tmp_path / "repro.py").write_text(script_text(check, sources, record, BASELINE))
    done = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**checkout_env(), "PYTHONPATH": ""})  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].endswith("this is not the failure")
