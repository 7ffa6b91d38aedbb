"""`torchmatrix github-matrix`: the GitHub Actions job matrix, one job per torch version and shard."""

from __future__ import annotations

import argparse
import json

from torchmatrix.commands.argument_types import positive
from torchmatrix.commands.selection_flags import add_selection_flags, cell_selection
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.config import load_matrix
from torchmatrix.scale.github import github_matrix

NAME = "github-matrix"
SHARD_REFUSAL = f"{NAME}: use --shards N, not --shard; every job gets its own --shard i/N"


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(NAME, help="print the GitHub Actions job matrix: one job per torch version and shard")
    add_selection_flags(parser)
    parser.add_argument("--shards", type=positive, default=1, help="shards per torch version (default 1)")
    return parser


def run(args: argparse.Namespace) -> ExitCode:
    matrix = load_matrix(args.config)
    selection = cell_selection(args, matrix, shard_refusal=SHARD_REFUSAL)
    print(json.dumps(github_matrix(matrix, args.shards, selection)))
    return ExitCode.PASSED
