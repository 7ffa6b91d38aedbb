"""`torchmatrix sensitivity`: the configured components wrapped in generic mutants; which ones the suites catch."""

from __future__ import annotations

import argparse
import sys

from torchmatrix.commands.argument_types import positive
from torchmatrix.commands.paths import reports_directory
from torchmatrix.commands.selection_flags import add_selection_flags, cell_selection
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.config import load_matrix
from torchmatrix.run.run_directory import new_run_id
from torchmatrix.run.run_request import RunError
from torchmatrix.sensitivity.command import run_sensitivity
from torchmatrix.sensitivity.registry import GENERIC_MUTANTS

NAME = "sensitivity"
SHARD_REFUSAL = "sensitivity: --shard does not apply; it picks its own few cells (narrow them with --only, -k)"


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        NAME,
        help="wrap the configured components in generic mutants and show which ones the suites catch; exit 1 on a miss",
    )
    add_selection_flags(parser)
    parser.add_argument(
        "--torch", default="system", metavar="VERSION", help="a version from matrix.toml, or 'system' (default)"
    )
    parser.add_argument(
        "--mutants",
        default=None,
        metavar="A,B",
        help=f"only these mutants (default all: {', '.join(m.name for m in GENERIC_MUTANTS)})",
    )
    parser.add_argument(
        "--reports",
        default=None,
        metavar="DIR",
        help="where its directory goes (default: reports/ next to matrix.toml)",
    )
    parser.add_argument("--slots", type=positive, default=None, help="as for run")
    return parser


def run(args: argparse.Namespace) -> ExitCode:
    matrix = load_matrix(args.config)
    if args.torch not in matrix.versions and args.torch != "system":
        raise RunError(
            f"--torch {args.torch}: not in [torch].versions of {matrix.path.name}; pass one of them or system"
        )
    selection = cell_selection(args, matrix, shard_refusal=SHARD_REFUSAL)
    out = reports_directory(args.reports, matrix) / f"sensitivity-{new_run_id()}"
    try:
        return run_sensitivity(
            matrix, version=args.torch, out=out, selection=selection, mutant_names=args.mutants, slots=args.slots
        )
    except KeyboardInterrupt:
        print(f"torchmatrix sensitivity: interrupted; the finished runs are under {out / 'runs'}", file=sys.stderr)
        return ExitCode.INTERRUPTED
