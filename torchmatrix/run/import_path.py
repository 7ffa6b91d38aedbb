"""What the processes that import the user's code see on sys.path: the component check and every
pytest (and rank) process of a run get it from here, so a component that passes the check imports
in the cells too.

The matrix directory comes first, so the user's own packages import by the names matrix.toml
gives; torchmatrix, its built-in suites and reference components come from the installed package.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def user_code_environment(matrix_root: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with the matrix directory first on PYTHONPATH (launchers and rank processes
    inherit it, whatever directory they start in); run the process with cwd=matrix_root."""
    inherited = [entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return {**environ, "PYTHONPATH": os.pathsep.join([str(matrix_root), *inherited])}
