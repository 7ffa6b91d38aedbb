"""`torchmatrix repro`: a standalone reproducer of a confirmed failure."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from torchmatrix.commands.paths import run_directory
from torchmatrix.exit_codes import ExitCode
from torchmatrix.repro.command import write_reproducer

NAME = "repro"


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        NAME,
        help="write a standalone reproducer (script, command, environment, bug-report README) of a confirmed failure",
    )
    parser.add_argument("run_dir", type=Path, help="the run directory (reports/<run-id>)")
    parser.add_argument("test_id", metavar="TORCH/CELL/SUITE::TEST", help="the failure, as the summary page names it")
    parser.add_argument("--out", type=Path, default=None, help="the directory to write (default: RUN/repro/<test id>)")
    parser.add_argument(
        "--python",
        default=None,
        help="the interpreter of that torch, for collect_env and a cross_version read's reading side (default: its gpu_matrix venv in .nox, else this one)",
    )
    parser.add_argument(
        "--writer-python",
        default=None,
        help="for a cross_version read: the interpreter of the torch that wrote the checkpoint (default: its gpu_matrix venv in .nox)",
    )
    parser.add_argument(
        "--config",
        default=None,
        help="the run's matrix file on this machine (default: matrix.toml here; the path its plan.json records is never used)",
    )
    return parser


def run(args: argparse.Namespace) -> ExitCode:
    written = write_reproducer(
        run_directory(args.run_dir).resolve(),
        args.test_id,
        out=args.out.resolve() if args.out else None,
        python=args.python,
        config=args.config,
        writer_python=args.writer_python,
    )
    out = written.out
    print(f"torchmatrix repro: wrote {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    print(f"torchmatrix repro: it needs {written.needs}: cd {shlex.quote(str(out))} && {written.command}")
    return ExitCode.PASSED
