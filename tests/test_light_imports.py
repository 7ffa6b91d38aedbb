"""The runner's light side: the noxfile loads in nox's own environment (nox only, no torch, no
junitparser), and every torchmatrix module imports without torch."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import torchmatrix

from helpers.checkout import REPO, checkout_env

BLOCK = "import sys; sys.modules.update(dict.fromkeys({blocked!r})); "


def run_blocked(blocked: list[str], code: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter where importing any of `blocked` fails."""
    return subprocess.run(
        [sys.executable, "-c", BLOCK.format(blocked=blocked) + code],
        cwd=REPO,
        env=checkout_env(),
        capture_output=True,
        text=True,
    )


def test_the_noxfile_loads_with_nothing_but_nox():
    done = run_blocked(["torch", "junitparser", "pytest", "lxml"], "import runpy; runpy.run_path('noxfile.py')")
    assert done.returncode == 0, done.stderr


def test_every_torchmatrix_module_imports_without_torch():
    modules = [
        m.name for m in pkgutil.walk_packages(torchmatrix.__path__, "torchmatrix.") if m.name != "torchmatrix.__main__"
    ]
    assert "torchmatrix.ranks.pool" in modules and len(modules) > 50
    done = run_blocked(["torch"], f"import importlib; [importlib.import_module(m) for m in {modules!r}]")
    assert done.returncode == 0, done.stderr
