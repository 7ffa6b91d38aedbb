"""The wheel carries the runner (with its report templates), the built-in suites and the reference components, under one name."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers.checkout import REPO, copy_checkout

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

# Top-level directories of the checkout -> the package they install as.
INSTALLED_AS = {"torchmatrix": "torchmatrix", "suites": "torchmatrix.suites", "models": "torchmatrix.models"}


def declared_packages() -> set[str]:
    return set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def test_every_package_directory_is_declared():
    found = set()
    for top, name in INSTALLED_AS.items():
        for init in (REPO / top).rglob("__init__.py"):
            parts = init.parent.relative_to(REPO / top).parts
            found.add(".".join([name, *parts]))
    assert found == declared_packages(), "pyproject.toml [tool.setuptools] packages lists each package directory"


@pytest.mark.slow
def test_the_wheel_holds_the_suites_and_models(tmp_path):
    source = copy_checkout(tmp_path / "src")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."],
        cwd=source,
        check=True,
        capture_output=True,
    )
    (wheel,) = Path(tmp_path).glob("torchmatrix-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in (
        "torchmatrix/suites/test_resume.py",
        "torchmatrix/suites/state/optimizer_state.py",
        "torchmatrix/models/transformer.py",
        "torchmatrix/models/mutants/resume.py",
        "torchmatrix/nox_sessions.py",
        "torchmatrix/reports/templates/summary.html",
        "torchmatrix/reports/templates/summary.md",
        "torchmatrix/reports/templates/summary.js",
    ):
        assert expected in names, expected
    assert not any(name.startswith(("suites/", "models/", "tests/")) for name in names), "no top-level suites or models"


def test_the_installed_package_imports_its_models_and_suites_from_elsewhere(tmp_path):
    """Whichever way this environment installed torchmatrix (editable here: setuptools' finder maps the names)."""
    code = "import torchmatrix.models.transformer, torchmatrix.suites.state.optimizer_state as s; print(s.__file__)"
    environ = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=environ, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).name == "optimizer_state.py"
