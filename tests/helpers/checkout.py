"""This checkout as the tests use it: its root, an environment that imports it, a copy of its files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# For a throwaway matrix.toml whose suites/ links to this checkout's: suites may resolve into it.
PROJECT_IS_THIS_CHECKOUT = f"\n[project]\nroot = {json.dumps(str(REPO))}\n"


def checkout_env(*also: Path | None) -> dict[str, str]:
    """The environment with this checkout importable, as an installed torchmatrix would be, and the
    directories `also` (a user's component modules)."""
    paths = [str(path) for path in also if path] + [str(REPO), os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def unconstrained_pip(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` for a test's own pip installs: the user's pip constraints (pip.conf's `constraint`,
    PIP_CONSTRAINT) lifted, since a configured `torch<=X` cap refuses the releases and wheels a test
    installs; the index settings stay, so the installs still find torch where the user's pip does."""
    return {**environ, "PIP_CONSTRAINT": os.devnull}


def copy_checkout(destination: Path) -> Path:
    """The files git knows (tracked and new, not ignored) of this checkout, so no build artefact travels."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.exists() or source.is_symlink():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name, follow_symlinks=False)
    return destination
