"""The checkpoint archive end to end on one release: torch 2.13.0 writes the flat FSDP2 foreach forms
(sync and async, two ranks) with `torchmatrix archive write --python`, and the checkpoint_archive suite
reads them back in a run: the same release loads and continues exactly, test ids name release and form."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from junitparser import JUnitXml

from helpers.checkout import REPO, checkout_env
from helpers.matrix_files import matrix_toml

pytestmark = pytest.mark.slow


def test_a_release_reads_its_own_archive_exactly(tmp_path):
    archive = tmp_path / "archive"
    written = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchmatrix.suites.checkpoints.archive_writer",
            "--to",
            str(archive),
            "--forms",
            "fsdp2/foreach/*",
        ],
        cwd=REPO,
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert written.returncode == 0, written.stderr[-3000:]
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(
        matrix_toml(
            axes={"world_size": [2]},
            suites={"checkpoint_archive": {"path": None, "options": {"archive": str(archive)}}},
        )
    )
    run = subprocess.run(
        [sys.executable, "-m", "torchmatrix", "run", "--config", str(matrix), "--torch", "system", "--run-id", "r"],
        cwd=tmp_path,
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    release = written.stdout.split('"torch": "')[1].split('"')[0]
    cases = {
        case.name.partition("][")[0] + "]": case
        for suite in JUnitXml.fromfile(str(tmp_path / "reports/r/junit.xml"))
        for case in suite
    }
    assert set(cases) == {
        f"test_loads_and_continues[archived={release}/fsdp2/foreach/sync]",
        f"test_loads_and_continues[archived={release}/fsdp2/foreach/async]",
    }
    assert all(case.is_passed for case in cases.values())
    continuations = re.findall(r'archive_continuation" value="([^"]*)"', (tmp_path / "reports/r/junit.xml").read_text())
    assert continuations == ["exact", "exact"]
