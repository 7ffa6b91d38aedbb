"""The commands docs/reference/command-line.md shows work from the set-up it gives: a fresh venv, `pip install -e .`.

nox's own environment lacks the project's dependencies (junitparser), so the docs send users
to this one-line install or to the nox sessions that do it; CI proves the install is enough.
"""

from __future__ import annotations

import os
import subprocess
import venv

import pytest

from helpers.checkout import REPO, unconstrained_pip
from helpers.report_runs import BASELINE, CANDIDATE, write_single_version_run

pytestmark = pytest.mark.slow


def test_every_command_the_docs_show_runs_after_the_one_line_install(tmp_path):
    venv.create(tmp_path / "venv", with_pip=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "-e", str(REPO)],
        env=unconstrained_pip(os.environ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr

    def torchmatrix(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [python, "-m", "torchmatrix", *args], cwd=REPO, capture_output=True, text=True, timeout=120
        )

    helped = torchmatrix("--help")
    assert helped.returncode == 0, helped.stderr
    for command in ("list", "run", "report", "compare", "merge", "github-matrix", "slurm"):
        assert command in helped.stdout
    listed = torchmatrix("list")
    assert listed.returncode == 0 and "ws1-none-flat-sdpa-adamw-default-none-none-none" in listed.stdout, listed.stderr
    old = write_single_version_run(tmp_path, BASELINE, "old")
    new = write_single_version_run(tmp_path, CANDIDATE, "new")
    reported = torchmatrix("report", str(new))
    assert reported.returncode == 0 and (new / "summary.html").is_file(), reported.stderr
    compared = torchmatrix("compare", str(old), str(new))
    assert compared.returncode == 1 and "#### Regressions" in compared.stdout, compared.stderr
