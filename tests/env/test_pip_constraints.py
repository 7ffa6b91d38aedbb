"""A pip constraint from the user's configuration that refuses a requested torch is named in one
line, with where it comes from and how to lift it for one command; other failures keep pip's reason."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import nox.command

from torchmatrix.env.pip_constraints import LIFT, blocking_constraint, configured_constraint
from torchmatrix.env.torch_install import install_torch
from torchmatrix.matrix.config import TorchInstall

# What pip 25 prints for torch==2.15.0 on a machine whose pip.conf caps torch (recorded).
REFUSED = """\
ERROR: Cannot install torch==2.15.0 because these package versions have conflicting dependencies.

The conflict is caused by:
    The user requested torch==2.15.0
    The user requested (constraint) torch<=2.14.1

To fix this you could try to:
1. loosen the range of package versions you've specified
2. remove package versions to allow pip attempt to solve the dependency conflict

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/#dealing-with-dependency-conflicts
"""
FILE_CONFIG = "global.cert='/etc/ssl/certs/ca.crt'\nglobal.constraint='/etc/xdg/pip/constraints.txt'\n"
ENV_CONFIG = FILE_CONFIG + ":env:.constraint='/home/me/caps.txt'\n"


def test_the_constraint_is_named_with_where_it_is_configured_and_how_to_lift_it():
    assert blocking_constraint("2.15.0", REFUSED, FILE_CONFIG, ()) == (
        "torch==2.15.0 is refused by the pip constraint torch<=2.14.1 from /etc/xdg/pip/constraints.txt, named by "
        "`global.constraint` in a pip.conf (`pip config debug` shows which); to install it for one command, prefix "
        "that command with PIP_CONSTRAINT=/dev/null (e.g. PIP_CONSTRAINT=/dev/null nox -s gpu_matrix)"
    )
    assert "from PIP_CONSTRAINT=/home/me/caps.txt;" in blocking_constraint("2.15.0", REFUSED, ENV_CONFIG, ())


def test_other_failures_and_matrix_tomls_own_constraints_keep_pips_reason():
    missing = "ERROR: Could not find a version that satisfies the requirement torch==9.9.9 (from versions: 2.13.0)\n"
    assert blocking_constraint("9.9.9", missing, FILE_CONFIG, ()) == ""
    assert blocking_constraint("2.15.0", REFUSED, "", ()) == "", "no configured constraint: not the user's config"
    assert blocking_constraint("2.15.0", REFUSED, FILE_CONFIG, ("torch<=2.14.1",)) == ""
    assert configured_constraint("global.index-url='https://x'\n") == ""


def test_pips_own_refusal_is_recognised_and_the_lift_works(tmp_path):
    """Real pip, a constraint set by PIP_CONSTRAINT (no network: --no-index): refused, recognised;
    the same command with the lift is no longer refused by the constraint."""
    caps = tmp_path / "caps.txt"
    caps.write_text("tmxfake<=1.0\n")
    environ = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_CONSTRAINT": str(caps)}
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "tmxfake==2.0"]
    refused = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=120)
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], env=environ, capture_output=True, text=True, check=True
    )
    assert refused.returncode != 0
    line = blocking_constraint("2.0", refused.stdout + refused.stderr, listed.stdout, ())
    assert line.startswith(f"torch==2.0 is refused by the pip constraint tmxfake<=1.0 from PIP_CONSTRAINT={caps};")
    lifted = subprocess.run(
        command, env={**environ, "PIP_CONSTRAINT": LIFT.split("=", 1)[1]}, capture_output=True, text=True, timeout=120
    )
    assert "(constraint)" not in lifted.stdout + lifted.stderr
    assert "from versions: none" in lifted.stderr, "only the missing package stops it now"


class RefusingSession:
    """A nox session whose installer prints pip's refusal and fails, as nox reports it."""

    venv_backend = "virtualenv"

    def __init__(self, available: str = "2.15.0, 2.14.1"):
        self.available = available
        self.virtualenv = SimpleNamespace(location=tempfile.mkdtemp(prefix="fake-venv-"))

    def run_install(self, *args, silent=False, log=True, success_codes=None, stdout=None, stderr=None):
        if args[-1] == "--version":
            return "pip 24.2 from /venv (python 3.11)"
        if "index" in args:
            return f"torch\nAvailable versions: {self.available}\n"
        stdout.write(REFUSED)
        stdout.flush()
        raise nox.command.CommandFailed("pip failed")

    def install(self, *args, **kwargs):
        return self.run_install(*args, **kwargs)


def test_an_install_refused_by_a_configured_constraint_fails_with_that_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHMATRIX_WHEELHOUSE", "off")
    monkeypatch.setenv("PIP_CONSTRAINT", str(tmp_path / "caps.txt"))
    result = install_torch(RefusingSession(), "2.15.0", TorchInstall(), tmp_path / "install.log")
    assert not result.ok
    assert result.reason.startswith(
        f"torch==2.15.0 is refused by the pip constraint torch<=2.14.1 from PIP_CONSTRAINT={tmp_path / 'caps.txt'};"
    )
    assert "\n" not in result.reason


def test_a_version_the_index_lacks_keeps_pips_reason_even_under_a_constraint(tmp_path, monkeypatch):
    """pip calls torch==9.9.9 a conflict under a cap too; the version not being there comes first."""
    monkeypatch.setenv("TORCHMATRIX_WHEELHOUSE", "off")
    monkeypatch.setenv("PIP_CONSTRAINT", str(tmp_path / "caps.txt"))
    result = install_torch(RefusingSession(available="2.14.1"), "2.15.0", TorchInstall(), tmp_path / "install.log")
    assert (
        result.reason
        == "ERROR: Cannot install torch==2.15.0 because these package versions have conflicting dependencies."
    )
