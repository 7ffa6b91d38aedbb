"""What nox and the install check cost per torch version when the venvs already exist.

For every version in matrix.toml: `nox -R -s "gpu_matrix(torch='V')" -- -k <matches no cell>`,
timed from outside; the target is <= 5 s per version. Then the virtualenv+pip backend against
uv for what `-R` skips (create a venv, install this project), to choose the default backend.

Build the venvs first (`nox -s gpu_matrix`, or pass --build). Reports go to a scratch copy of
the matrix, so reports/latest is left alone.

    python bench/env_overhead.py [--build]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 5.0
NO_CELL = "no_cell_has_this_id"

sys.path.insert(0, str(REPO))

from torchmatrix.config import load_matrix  # noqa: E402


def nox(*args: str, env: dict) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(REPO / "noxfile.py"), *args], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"nox {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return time.monotonic() - started, done.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", action="store_true", help="build the venvs first (nox -s gpu_matrix --install-only)")
    args = parser.parse_args()
    matrix = load_matrix(REPO / "matrix.toml")
    versions = [v for v in matrix.versions if v != "system"]
    with tempfile.TemporaryDirectory(prefix="torchmatrix-env-") as tmp:
        scratch = Path(tmp)
        shutil.copy(REPO / "matrix.toml", scratch / "matrix.toml")
        for name in ("suites", "models"):
            (scratch / name).symlink_to(REPO / name)
        env = {**os.environ, "TORCHMATRIX_CONFIG": str(scratch / "matrix.toml"), "TORCHMATRIX_RUN_ID": "env-overhead"}
        if args.build:
            nox("--install-only", "-s", "gpu_matrix", env=env)
        print("| torch | `nox -R -s gpu_matrix(torch=V) -- -k <no cell>` wall | target <= 5 s |")
        print("|---|---|---|")
        for version in versions:
            session = f"gpu_matrix(torch='{version}')"
            wall, _ = nox("-R", "-s", session, "--", "-k", NO_CELL, env=env)
            print(f"| {version} | {wall:.1f} s | {'met' if wall <= TARGET_S else 'NOT met'} |")
        print()
        print("| venv backend | fresh venv + `pip install -e .` (the report session) |")
        print("|---|---|")
        for backend in ("virtualenv", "uv"):
            if backend == "uv" and shutil.which("uv") is None and importlib.util.find_spec("uv") is None:
                print("| uv | not installed (pip install uv) |")
                continue
            wall, _ = nox(
                "--envdir",
                str(scratch / backend),
                "--force-venv-backend",
                backend,
                "-s",
                "report",
                "--",
                str(scratch / "reports" / "env-overhead"),
                env=env,
            )
            print(f"| {backend} | {wall:.1f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
