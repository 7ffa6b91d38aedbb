"""`torchmatrix bisect`: the first torch release between two pins where a regression appears."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from torchmatrix.bisect.command import BisectRequest, run_bisect
from torchmatrix.bisect.versions import between
from torchmatrix.commands.argument_types import positive
from torchmatrix.commands.paths import directory_to_write, reports_directory, run_directory
from torchmatrix.commands.selection_flags import add_selection_flags, cell_selection
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.config import load_matrix
from torchmatrix.matrix.selection import SelectionError
from torchmatrix.run.run_request import RunError

NAME = "bisect"
SHARD_REFUSAL = "bisect: --shard does not apply; narrow the cells with --only and -k"


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        NAME,
        help="find the first torch release between two pins where a regression appears; exit 1 when a search has no answer",
    )
    add_selection_flags(parser)
    parser.add_argument(
        "--good",
        metavar="VERSION",
        help="a torch release the selected tests pass on (the older pin), or a dated nightly (nightly-YYYYMMDD) to bisect by date",
    )
    parser.add_argument(
        "--bad", metavar="VERSION", help="a torch release they fail on (the newer pin), or a later dated nightly"
    )
    parser.add_argument(
        "--from",
        dest="from_run",
        type=Path,
        metavar="RUN",
        help="bisect the confirmed regressions of this run directory's upgrade diff (instead of --good/--bad)",
    )
    parser.add_argument(
        "--envdir",
        type=Path,
        default=None,
        help="nox's envdir whose gpu_matrix venvs the steps use and add to (default: .nox next to matrix.toml)",
    )
    parser.add_argument(
        "--reports",
        default=None,
        metavar="DIR",
        help="where the report goes without --from (default: reports/ next to matrix.toml)",
    )
    parser.add_argument("--slots", type=positive, default=None, help="as for run")
    return parser


def run(args: argparse.Namespace) -> ExitCode:
    matrix = load_matrix(args.config)
    if importlib.util.find_spec("nox") is None:
        raise RunError("bisect makes gpu_matrix's venvs with nox, which this environment lacks; pip install nox")
    selection = cell_selection(args, matrix, shard_refusal=SHARD_REFUSAL)
    if args.from_run is not None and (args.good or args.bad or selection.narrows):
        raise SelectionError("bisect: --from RUN takes the run's regressions; drop --good, --bad, --only and -k")
    if args.from_run is None and not (args.good and args.bad):
        raise SelectionError("bisect: pass --good VERSION and --bad VERSION, or --from RUN")
    if args.from_run is not None:
        run_directory(args.from_run, "--from")
    matrix.select(selection)  # a selection that keeps no cell is refused here, before any install
    if args.from_run is None:
        between(args.good, args.bad, [])  # so are pins that are not versions, or out of order
    request = BisectRequest(
        matrix=matrix,
        envdir=directory_to_write((args.envdir or matrix.root / ".nox").resolve(), "--envdir"),
        reports=directory_to_write(reports_directory(args.reports, matrix), "--reports"),
        good=args.good,
        bad=args.bad,
        from_run=args.from_run.resolve() if args.from_run else None,
        cell_selection=selection,
        slots=args.slots,
    )
    try:
        return run_bisect(request)
    except KeyboardInterrupt:
        print("torchmatrix bisect: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
