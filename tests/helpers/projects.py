"""A throwaway project directory run through the real CLI."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import cli_forks
from helpers.checkout import checkout_env


class Project:
    """A temporary project directory: matrix.toml plus suite files, run through the real CLI."""

    def __init__(self, root: Path):
        self.root = root
        (root / "suites").mkdir(parents=True, exist_ok=True)

    def write(self, relative: str, text: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    def write_suites(self, matrix: str, **suites: str) -> None:
        """matrix.toml and the suites package holding each suite file `suites/<name>.py` from its source."""
        self.write("matrix.toml", matrix)
        self.write("suites/__init__.py", "")
        for name, source in suites.items():
            self.write(f"suites/{name}.py", source)

    def torchmatrix(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """Run `python -m torchmatrix ARGS` in the project directory: in a fork of this test process's
        preloaded server (helpers/cli_forks.py) where it runs as in a fresh interpreter, else started."""
        env = checkout_env()
        if cli_forks.shared is not None:
            with cli_forks.shared.serving(env) as forks:
                if forks is not None:
                    return forks.run(self.root, *args, timeout=timeout)
        return subprocess.run(
            [sys.executable, "-m", "torchmatrix", *args],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
