"""`torchmatrix cross-read`: each torch version of a run loads the checkpoints the other versions wrote."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchmatrix.commands.argument_types import interpreter
from torchmatrix.commands.paths import run_directory
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.config import load_matrix
from torchmatrix.run.cross_version import read_pass

NAME = "cross-read"


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        NAME,
        help="each torch version of a run loads the checkpoints the other versions wrote (cross_version); exit 1 on a failed load",
    )
    parser.add_argument("run_dir", type=Path, help="a run directory whose versions ran the cross_version suite")
    parser.add_argument(
        "--config",
        default="matrix.toml",
        help="this machine's matrix file, whose components read (default: ./matrix.toml; never the run's own)",
    )
    parser.add_argument(
        "--envdir",
        type=Path,
        default=None,
        help="nox's envdir whose gpu_matrix venvs read, one per torch version (default: .nox next to matrix.toml)",
    )
    parser.add_argument(
        "--python",
        dest="interpreters",
        action="append",
        default=[],
        type=interpreter,
        metavar="VERSION=PATH",
        help="the interpreter that reads for this torch version instead of its gpu_matrix venv (repeatable)",
    )
    return parser


def run(args: argparse.Namespace) -> ExitCode:
    run_dir = run_directory(args.run_dir)
    matrix = load_matrix(args.config)
    envdir = (args.envdir or matrix.root / ".nox").resolve()
    return read_pass(run_dir.resolve(), matrix, envdir, dict(args.interpreters))
