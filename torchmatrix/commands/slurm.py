"""`torchmatrix slurm`: sbatch scripts, an array job per shard, multi-node jobs and a merge job."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchmatrix.commands.argument_types import positive
from torchmatrix.commands.selection_flags import add_selection_flags, cell_selection
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.config import load_matrix
from torchmatrix.scale.slurm import SlurmOptions, write_slurm

NAME = "slurm"
SHARD_REFUSAL = f"{NAME}: use --shards N, not --shard; every job gets its own --shard i/N"


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        NAME, help="write sbatch scripts: an array job per shard, multi-node jobs, a merge job"
    )
    add_selection_flags(parser)
    parser.add_argument(
        "--shards", type=positive, default=1, help="shards per torch version for cells that fit on one node"
    )
    parser.add_argument("--gpus-per-node", type=positive, required=True, help="GPUs per node; wider cells span nodes")
    parser.add_argument("--partition", default=None, help="sbatch --partition")
    parser.add_argument("--time", default="04:00:00", help="sbatch --time per job (default 04:00:00)")
    parser.add_argument("--rdzv-port", type=positive, default=29500, help="torchrun rendezvous port on the first node")
    parser.add_argument(
        "--out", type=Path, default=Path("reports/slurm"), help="where the scripts go (default reports/slurm)"
    )
    return parser


def run(args: argparse.Namespace) -> ExitCode:
    matrix = load_matrix(args.config)
    selection = cell_selection(args, matrix, shard_refusal=SHARD_REFUSAL)
    options = SlurmOptions(args.shards, args.gpus_per_node, args.partition, args.time, args.rdzv_port)
    out = args.out if args.out.is_absolute() else matrix.root / args.out
    scripts = write_slurm(matrix, options, out, selection)
    print(f"torchmatrix: wrote {', '.join(p.name for p in scripts)} to {out}; submit with {out / 'submit.sh'}")
    return ExitCode.PASSED
