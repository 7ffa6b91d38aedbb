"""`torchmatrix archive write --torch V`: write the checkpoint archive's forms with torch release V.

The release installs into its gpu_matrix venv (torchmatrix/env/version_venv.py, reused when
installed before), and the writer (suites/checkpoints/archive_writer.py) runs in it, so an old release writes
without touching this environment. The `checkpoint_archive` suite reads what it wrote.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from torchmatrix.commands.paths import directory_to_write
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.config import load_matrix
from torchmatrix.status import count
from torchmatrix.user_error import UserError

NAME = "archive"
WRITER = "torchmatrix.suites.checkpoints.archive_writer"
SHIPPED = Path(__file__).resolve().parents[2] / "archive" / "checkpoints"


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        NAME, help="write the checkpoint archive's forms with one torch release (read by the checkpoint_archive suite)"
    )
    parser.add_argument(
        "action", choices=("write",), help="write: install torch V into its venv and write every form it can"
    )
    parser.add_argument("--torch", required=True, dest="version", help="the release that writes, e.g. 2.4.0")
    parser.add_argument(
        "--to",
        type=Path,
        default=SHIPPED,
        help="the archive directory; the forms go under <to>/<V> (default: this checkout's archive/checkpoints)",
    )
    parser.add_argument(
        "--config",
        default="matrix.toml",
        help="the matrix file whose [torch.install] installs V (default: ./matrix.toml)",
    )
    parser.add_argument(
        "--envdir", type=Path, default=None, help="where the release's venv goes (default: .nox next to matrix.toml)"
    )
    parser.add_argument(
        "--python", type=Path, default=None, help="an interpreter that already has torch V and torchmatrix; no install"
    )
    return parser


def run(args: argparse.Namespace) -> ExitCode:
    target = directory_to_write(args.to.resolve(), "--to")
    python, env = args.python, None
    if python is None:
        from torchmatrix.env.version_venv import prepare_venv

        matrix = load_matrix(args.config)
        envdir = (args.envdir or matrix.root / ".nox").resolve()
        venv, installed, _ = prepare_venv(matrix, envdir, args.version, target / ".logs" / args.version)
        if not installed.ok:
            raise UserError(f"torch {args.version} did not install into {venv.location}: {installed.reason}")
        python, env = venv.python, venv.environment()
    command = [str(python), "-m", WRITER, "--to", str(target), "--release", args.version]
    log = target / ".logs" / args.version / "write.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"torchmatrix archive: torch {args.version} writes into {target / args.version} (its ranks' output: {log})",
        flush=True,
    )
    with log.open("w") as output:
        finished = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=output, check=False)
    manifest_path = target / args.version / "manifest.json"
    if finished.returncode not in (0, 1) or not manifest_path.is_file():
        print(f"torchmatrix archive: the writer exited {finished.returncode}; its output is in {log}")
        return ExitCode.FAILED
    manifest = json.loads(manifest_path.read_text())
    print(
        f"torchmatrix archive: torch {manifest['version']} ({manifest['git_version'][:12]}) wrote "
        f"{count(len(manifest['written']), 'form')}; {count(len(manifest['not_written']), 'form')} it cannot write"
    )
    for form, reason in manifest["not_written"].items():
        print(f"  not written: {form}: {reason}")
    return ExitCode.PASSED if manifest["written"] else ExitCode.FAILED
