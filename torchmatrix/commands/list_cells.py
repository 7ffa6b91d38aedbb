"""`torchmatrix list`: the cells the filters select, one id a line or as JSON."""

from __future__ import annotations

import argparse
import json
import sys

from torchmatrix.commands.selection_flags import add_selection_flags, cell_selection
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.config import load_matrix

NAME = "list"


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(NAME, help="print the cells the filters select")
    add_selection_flags(parser)
    parser.add_argument(
        "--json", action="store_true", help="print JSON: versions, baseline and the cells with their axis values"
    )
    return parser


def run(args: argparse.Namespace) -> ExitCode:
    matrix = load_matrix(args.config)
    cells = matrix.select(cell_selection(args, matrix))
    if args.json:
        print(
            json.dumps(
                {
                    "versions": list(matrix.versions),
                    "baseline": matrix.baseline,
                    "cells": [{"id": c.id, **dict(c)} for c in cells],
                },
                indent=2,
            )
        )
    else:
        sys.stdout.write("".join(f"{cell.id}\n" for cell in cells))  # one write: 10^5 print calls cost a second
        print(
            f"{len(cells)} cells x {len(matrix.versions)} torch versions ({', '.join(matrix.versions)})",
            file=sys.stderr,
        )
    return ExitCode.PASSED
