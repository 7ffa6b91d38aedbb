"""`--config`, `--only`, `-k` and `--shard`, declared once for every command that selects cells and
parsed once into the `CellSelection` it passes down."""

from __future__ import annotations

import argparse

from torchmatrix.matrix.config import Matrix
from torchmatrix.matrix.selection import CellSelection, SelectionError


def add_selection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="matrix.toml", help="the matrix file (default: ./matrix.toml)")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="AXIS=V1,V2",
        help="keep cells with one of these values (repeatable; AND across axes)",
    )
    parser.add_argument(
        "-k", dest="keyword", metavar="EXPR", help="keep cells whose id matches, e.g. -k 'fsdp2 and not ws4'"
    )
    parser.add_argument(
        "--shard", metavar="I/N", help="keep shard I of N (1-based); the N shards partition the selection"
    )


def cell_selection(args: argparse.Namespace, matrix: Matrix, *, shard_refusal: str | None = None) -> CellSelection:
    """The selection the flags spell, checked against the matrix; a command that takes no `--shard`
    passes the line that refuses one."""
    selection = CellSelection.parse(args.only, args.keyword, args.shard, matrix.axes)
    if shard_refusal and selection.shard:
        raise SelectionError(shard_refusal)
    return selection
