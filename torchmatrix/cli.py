"""`python -m torchmatrix list | run | sensitivity | report | cross-read | compare | bisect | repro | merge | github-matrix | slurm | archive`.

Each command is a module of `torchmatrix/commands/` with its parser and its handler; this module
lists them in the order `--help` shows them and dispatches to the one named. Exit codes:
`ExitCode` (torchmatrix/exit_codes.py); every `UserError` is caught here once and printed as one
line with exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from torchmatrix.commands import (
    archive,
    bisect,
    compare,
    cross_read,
    github_matrix,
    list_cells,
    merge,
    report,
    repro,
    run,
    sensitivity,
    slurm,
)
from torchmatrix.exit_codes import ExitCode
from torchmatrix.user_error import UserError

COMMANDS = (
    list_cells,
    run,
    sensitivity,
    report,
    cross_read,
    compare,
    bisect,
    repro,
    merge,
    github_matrix,
    slurm,
    archive,
)
"""Every command's module, in the order `--help` and the reference page list them."""

PRINTING_COMMANDS = (list_cells.NAME, github_matrix.NAME)
"""Commands whose whole job is printing: a reader that stops early (`list --json | head -3`) got what it asked for."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchmatrix", description="Run PyTorch training-correctness suites over a matrix of cells."
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(subparsers).set_defaults(handler=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except UserError as error:
        print(f"torchmatrix: error: {error}", file=sys.stderr)
        return error.exit_code
    except BrokenPipeError:
        if args.command not in PRINTING_COMMANDS:
            raise
        _drop_stdout()
        return ExitCode.PASSED


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the flush at exit does not hit the closed pipe again (the
    recipe of Python's signal docs for SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
