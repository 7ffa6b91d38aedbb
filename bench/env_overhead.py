"""What nox and the install check cost per torch version when the venvs already exist.

For every version in matrix.toml: `nox -R -s "gpu_matrix(torch='V')" -- --shard <an empty shard>`,
timed from outside; the target is <= 5 s per version. Then the virtualenv+pip backend against
uv for what `-R` skips (create a venv, install this project), to choose the default backend.

Build the venvs first (`nox -s gpu_matrix`, or pass --build). Reports go to a scratch copy of
the matrix, so reports/latest is left alone.

With --install V: a cold install of torch V (fresh venv, empty download cache), then a warm one
(another fresh venv, the cache the first filled), through `nox --install-only`, per backend.

    python bench/env_overhead.py [--build]
    python bench/env_overhead.py --install 2.7.1 [--backends virtualenv,uv]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 5.0

sys.path.insert(0, str(REPO))

from tiny_project import write_tiny_project  # noqa: E402

from torchmatrix.matrix.config import load_matrix  # noqa: E402


def nox(*args: str, env: dict) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(REPO / "noxfile.py"), *args], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"nox {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return time.monotonic() - started, done.stderr


def cache_size(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def install_cold_warm(version: str, backends: list[str], scratch: Path, env: dict) -> None:
    """Install torch `version` twice per backend into fresh venvs sharing one empty download cache
    (pip's, uv's and torchmatrix's wheelhouse, all under one directory)."""
    text = (REPO / "matrix.toml").read_text()
    text = re.sub(r"(?m)^versions = .*$", f'versions = ["{version}"]', text)
    text = re.sub(r"(?m)^baseline = .*$", f'baseline = "{version}"', text)
    (scratch / "matrix.toml").write_text(text)
    print(f"| backend | torch {version} cold (empty cache) | warm (cache filled) | cache after cold |")
    print("|---|---|---|---|")
    for backend in backends:
        if backend == "uv" and shutil.which("uv") is None and importlib.util.find_spec("uv") is None:
            print("| uv | not installed (pip install uv) | | |")
            continue
        cache = scratch / f"{backend}-cache"
        backend_env = {
            **env,
            "PIP_CACHE_DIR": str(cache / "pip"),
            "UV_CACHE_DIR": str(cache / "uv"),
            "TORCHMATRIX_WHEELHOUSE": str(cache / "wheelhouse"),
        }
        walls = []
        for attempt in ("cold", "warm"):
            wall, log = nox(
                "--envdir",
                str(scratch / f"{backend}-{attempt}"),
                "--force-venv-backend",
                backend,
                "--install-only",
                "-s",
                f"gpu_matrix(torch='{version}')",
                env=backend_env,
            )
            walls.append(wall)
            shown = [line for line in log.splitlines() if line.startswith(f"torch {version}:")]
            print(f"<!-- {backend} {attempt}: {shown[-1] if shown else 'no progress line'} -->", flush=True)
            shutil.rmtree(scratch / f"{backend}-{attempt}")
            if attempt == "cold":
                cached = cache_size(cache)
        print(f"| {backend} | {walls[0]:.1f} s | {walls[1]:.1f} s | {cached:.0f} MB |", flush=True)


def tiny() -> int:
    """The parts of this bench that need no venv: what nox costs to load the noxfile with the
    matrix, and `torchmatrix run` of an empty shard on the torch installed here."""
    with tempfile.TemporaryDirectory(prefix="torchmatrix-env-") as tmp:
        matrix = write_tiny_project(Path(tmp), world_sizes=(1,))
        env = {**os.environ, "TORCHMATRIX_CONFIG": str(matrix), "TORCHMATRIX_RUN_ID": "env-overhead"}
        listed, _ = nox("-l", env=env)
        started = time.monotonic()
        command = [sys.executable, "-m", "torchmatrix", "run", "--torch", "system", "--config", str(matrix)]
        subprocess.run([*command, "--shard", "2/2"], env=env, check=True, stdout=subprocess.DEVNULL)
        shard = time.monotonic() - started
    print("| step | wall |\n|---|---|")
    print(f"| `nox -l` (loads the noxfile and matrix.toml) | {listed:.1f} s |")
    print(f"| `torchmatrix run --shard <empty shard>` on the torch here | {shard:.1f} s |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", action="store_true", help="build the venvs first (nox -s gpu_matrix --install-only)")
    parser.add_argument("--install", metavar="V", help="time a cold and a warm install of torch V instead")
    parser.add_argument("--backends", default="virtualenv,uv", help="with --install: nox venv backends to time")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="nox loading the noxfile (`nox -l`) and an empty shard run without nox, on the torch here (what CI runs)",
    )
    args = parser.parse_args()
    if args.tiny:
        return tiny()
    matrix = load_matrix(REPO / "matrix.toml")
    versions = [v for v in matrix.versions if v != "system"]
    with tempfile.TemporaryDirectory(prefix="torchmatrix-env-") as tmp:
        scratch = Path(tmp)
        (scratch / "matrix.toml").write_text((REPO / "matrix.toml").read_text())
        env = {**os.environ, "TORCHMATRIX_CONFIG": str(scratch / "matrix.toml"), "TORCHMATRIX_RUN_ID": "env-overhead"}
        if args.install:
            install_cold_warm(args.install, args.backends.split(","), scratch, env)
            return 0
        if args.build:
            nox("--install-only", "-s", "gpu_matrix", env=env)
        # More shards than cells: the last one is empty, which a run accepts (a -k matching
        # nothing is refused as a typo).
        empty_shard = f"{len(matrix.cells()) + 1}/{len(matrix.cells()) + 1}"
        print("| torch | `nox -R -s gpu_matrix(torch=V) -- --shard <empty shard>` wall | target <= 5 s |")
        print("|---|---|---|")
        for version in versions:
            session = f"gpu_matrix(torch='{version}')"
            wall, _ = nox("-R", "-s", session, "--", "--shard", empty_shard, env=env)
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
