"""Where a run's pytest processes keep their tests' `tmp_path` folders: under a root of torchmatrix's
own, not pytest's default one. On exit pytest deletes all but the newest three numbered folders of its
root, so under the default root a run's pytest process deleted the folders of the user's own pytest
sessions, and, when one was large, ran past the runner's exit deadline and its cells errored."""

from __future__ import annotations

import getpass
import os
import tempfile
from pathlib import Path

TEMPROOT_VARIABLE = "PYTEST_DEBUG_TEMPROOT"
"""pytest's documented variable for the root of tmp_path's numbered folders (`pytest-of-<user>/pytest-N`)."""


def keep_tmp_paths_apart() -> None:
    """Point this pytest process's tmp_path folders at `torchmatrix-of-<user>` inside the root pytest
    would use (the variable's, else the system's temporary directory), made here and this user's alone;
    called before any test asks for a tmp_path, since pytest reads the variable then."""
    root = Path(os.environ.get(TEMPROOT_VARIABLE) or tempfile.gettempdir()) / f"torchmatrix-of-{_user()}"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.environ[TEMPROOT_VARIABLE] = str(root)


def _user() -> str:
    """The user name pytest would put in its folder's name; "unknown" where the system has none for this uid."""
    try:
        return getpass.getuser()
    except (ImportError, KeyError, OSError):
        return "unknown"
