"""`torchmatrix run`: the selected cells of one torch version, in this environment."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchmatrix.commands.argument_types import (
    non_negative,
    positive,
    positive_float,
    progress_part,
    seconds_or_unknown,
    suite_test,
    torch_version,
)
from torchmatrix.commands.paths import reports_directory
from torchmatrix.commands.selection_flags import add_selection_flags, cell_selection
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.config import load_matrix
from torchmatrix.matrix.suite_selection import EXAMPLE_SUITE, SuiteSelection, example_test
from torchmatrix.messages.compile_store import STORE_VARIABLE, default_root
from torchmatrix.messages.output_cap import DEFAULT_CAP_BYTES
from torchmatrix.reports.closing import run_closing_lines
from torchmatrix.reports.prerelease import add_flag, run_exit, with_flag
from torchmatrix.run.compile_eviction import DEFAULT_CAP_GB, GB
from torchmatrix.run.confirmation import DEFAULT_LIMIT as DEFAULT_CONFIRM_LIMIT
from torchmatrix.run.progress import InvocationPart
from torchmatrix.run.run_directory import check_run_id, new_run_id
from torchmatrix.run.run_request import DEFAULT_MAX_CPU_RANKS, RunError, RunRequest
from torchmatrix.run.runner import run_version

NAME = "run"


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(NAME, help="run the selected cells of one torch version in this environment")
    add_selection_flags(parser)
    parser.add_argument(
        "--torch",
        required=True,
        type=torch_version,
        metavar="VERSION",
        help="a version from matrix.toml, or 'system' for the torch installed here",
    )
    parser.add_argument(
        "--reports",
        default=None,
        metavar="DIR",
        help="where run directories go (default: reports/ next to matrix.toml)",
    )
    parser.add_argument(
        "--run-id", default=None, help="run directory name; nox passes one so all versions land together"
    )
    parser.add_argument(
        "--restart",
        action="store_true",
        help="the run id was used before (a requeued job): delete what that attempt left for this torch version and start clean",
    )
    parser.add_argument(
        "--suite",
        dest="suites",
        action="append",
        default=[],
        metavar="NAME",
        help=f"run only this suite of matrix.toml (repeatable), e.g. --suite {EXAMPLE_SUITE}",
    )
    parser.add_argument(
        "--test",
        dest="tests",
        action="append",
        default=[],
        type=suite_test,
        metavar="SUITE::TEST",
        help=f"run only this test of the selected cells (repeatable), e.g. --test {example_test()}; "
        "a function name runs every parametrization of it, TEST[name=value] one of them",
    )
    parser.add_argument("--install-log", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--report-follows",
        action="store_true",
        help="a report step runs after this one (nox passes it): the closing lines say so instead of naming the command",
    )
    parser.add_argument(
        "--no-report-hint", action="store_true", help=argparse.SUPPRESS
    )  # a bisect step: the bisect writes its own report, so the closing lines name no report command
    parser.add_argument(
        "--cross-version-reads",
        action="store_true",
        help="load the other torch versions' cross_version checkpoints of this run (cross-read passes it)",
    )
    parser.add_argument(
        "--peer",
        dest="peers",
        action="append",
        type=torch_version,
        default=None,
        metavar="VERSION",
        help="pair cross_version with this torch release instead of matrix.toml's versions (repeatable; bisect passes it): "
        "it reads this run's writes, or a read pass reads its writes; --torch may then name a release matrix.toml does not list",
    )
    parser.add_argument(
        "--progress-part",
        type=progress_part,
        default=(1, 1),
        metavar="K/N",
        help="this torch version is the K-th of N one invocation runs (nox passes it): the [k/N] count and the ETA continue across them",
    )
    parser.add_argument(
        "--progress-since",
        type=float,
        default=None,
        metavar="EPOCH",
        help="when that invocation started, in seconds since the epoch (nox passes it): elapsed time and ETA count from it",
    )
    parser.add_argument(
        "--progress-installs-after",
        type=seconds_or_unknown,
        default=0.0,
        metavar="SECONDS",
        help="the torch versions after this one take SECONDS to install, estimated from their downloads, or 'unknown' (nox passes it): the ETA counts them",
    )
    parser.add_argument(
        "--slots",
        type=positive,
        default=None,
        help="ranks that may run at once on a CPU-only machine (default: its cores); GPUs are the slots on CUDA",
    )
    parser.add_argument(
        "--confirm-limit",
        type=non_negative,
        default=DEFAULT_CONFIRM_LIMIT,
        metavar="N",
        help=f"re-run at most N failed tests alone, each in a fresh process, to tell real failures from order-dependent ones (default {DEFAULT_CONFIRM_LIMIT}; 0: off)",
    )
    parser.add_argument(
        "--max-cpu-ranks",
        type=positive,
        default=DEFAULT_MAX_CPU_RANKS,
        metavar="N",
        help=f"on a CPU-only machine, refuse cells wider than N simulated ranks (default {DEFAULT_MAX_CPU_RANKS}; each is a process)",
    )
    parser.add_argument(
        "--output-cap",
        type=positive,
        default=DEFAULT_CAP_BYTES,
        metavar="BYTES",
        help=f"keep at most this much of each test's stdout, stderr and failure text (head and tail; default {DEFAULT_CAP_BYTES})",
    )
    parser.add_argument(
        "--compile-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"keep what torch.compile builds in DIR for every later run of the same torch build, compiler and sources "
        f"(default: ${STORE_VARIABLE}, else ~/.cache/torchmatrix/compile-cache)",
    )
    parser.add_argument(
        "--cold-compile",
        action="store_true",
        help="compile everything afresh, in the run's own directory: no earlier run's graphs or kernels are used or kept",
    )
    parser.add_argument(
        "--compile-cache-size",
        type=positive_float,
        default=DEFAULT_CAP_GB,
        metavar="GB",
        help=f"after the run, remove the compile cache's least recently used cells beyond GB (default {DEFAULT_CAP_GB:g})",
    )
    parser.add_argument(
        "--gpus-per-node",
        type=positive,
        default=None,
        help="GPUs per node (default: the GPUs seen here; no limit on CPU)",
    )
    parser.add_argument(
        "--multinode-launcher",
        default=None,
        metavar="CMD",
        help="runs cells wider than a node, e.g. 'srun --nodes={nnodes} torchrun --nnodes={nnodes} --nproc-per-node={nproc_per_node} ...'",
    )
    add_flag(parser, "a failure on a nightly or rc value")
    return parser


def run(args: argparse.Namespace) -> ExitCode:
    matrix = load_matrix(args.config)
    if args.torch not in matrix.versions and args.torch != "system" and not args.peers:
        raise RunError(
            f"--torch {args.torch}: not in [torch].versions of {matrix.path.name} ({', '.join(matrix.versions)}); add it there or pass --torch system"
        )
    request = RunRequest(
        matrix=matrix,
        version=args.torch,
        reports=reports_directory(args.reports, matrix),
        run_id=check_run_id(args.run_id, "--run-id") if args.run_id else new_run_id(),
        restart=args.restart,
        max_cpu_ranks=args.max_cpu_ranks,
        output_cap=args.output_cap,
        install_log=args.install_log,
        gpus_per_node=args.gpus_per_node,
        multinode_launcher=args.multinode_launcher,
        slots=args.slots,
        confirm_limit=args.confirm_limit,
        part=InvocationPart(
            *args.progress_part,
            since=args.progress_since,
            installs_after=args.progress_installs_after,
            report_follows=args.report_follows,
        ),
        cross_version_reads=args.cross_version_reads,
        peers=tuple(args.peers) if args.peers else None,
        selection=SuiteSelection(tuple(args.suites), tuple(args.tests)),
        cell_selection=cell_selection(args, matrix),
        compile_root=None if args.cold_compile else (args.compile_cache or default_root()).absolute(),
        compile_cap_bytes=int(args.compile_cache_size * GB),
    )
    code = run_exit(args.torch, run_version(request), with_flag(matrix.report, args.prerelease_blocks))
    if not request.cross_version_reads:
        print(
            run_closing_lines(
                request.run_dir,
                failed=code == ExitCode.FAILED,
                report_follows=args.report_follows,
                report_hint=not args.no_report_hint,
            )
        )
    return code
