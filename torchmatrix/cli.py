"""`python -m torchmatrix list | run | sensitivity | report | compare | bisect | repro | merge | github-matrix | slurm`.

Exit codes: `ExitCode` (torchmatrix/exit_codes.py); every `UserError` is caught here once and printed
as one line with exit 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import sys
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.bisect.command import BisectRequest, run_bisect
from torchmatrix.bisect.versions import between
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.config import Matrix, load_matrix
from torchmatrix.matrix.safe_names import check_name
from torchmatrix.matrix.selection import SelectionError, Shard, parse_only
from torchmatrix.matrix.suite_selection import EXAMPLE_SUITE, SuiteSelection, example_test, split_test
from torchmatrix.ranks.output_cap import DEFAULT_CAP_BYTES
from torchmatrix.reports import junit
from torchmatrix.reports.closing import closing_lines, run_closing_lines
from torchmatrix.reports.confirmation import DEFAULT_LIMIT as DEFAULT_CONFIRM_LIMIT
from torchmatrix.reports.report import append_step_summary, compare_markdown, load_run, write_report
from torchmatrix.reports.upgrade_diff import CompareError, upgrade_diffs
from torchmatrix.repro.command import write_reproducer
from torchmatrix.run.cross_version import read_pass
from torchmatrix.run.progress import InvocationPart
from torchmatrix.run.run_directory import check_run_id, new_run_id
from torchmatrix.run.runner import DEFAULT_MAX_CPU_RANKS, RunError, RunRequest, run_version
from torchmatrix.scale.github import github_matrix
from torchmatrix.scale.merge import merge_reports
from torchmatrix.scale.slurm import SlurmOptions, write_slurm
from torchmatrix.sensitivity.command import GENERIC_MUTANTS, run_sensitivity
from torchmatrix.user_error import UserError


def _add_selection(parser: argparse.ArgumentParser) -> None:
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


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; pass 0 to switch it off")
    return value


def _progress_part(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise argparse.ArgumentTypeError(f"{text!r}: write it as K/N with 1 <= K <= N, e.g. 2/3")
    return int(match[1]), int(match[2])


def _seconds_or_unknown(text: str) -> float | None:
    if text == "unknown":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: pass seconds (0 or more) or 'unknown'")
    return value


def _interpreter(text: str) -> tuple[str, str]:
    version, _, python = text.partition("=")
    if not version or not python:
        raise argparse.ArgumentTypeError(f"{text!r}: write it as VERSION=PATH, e.g. 2.14.1=/opt/venv/bin/python")
    if not Path(python).is_file() or not os.access(python, os.X_OK):
        raise argparse.ArgumentTypeError(f"{python!r} is not an executable file; pass a venv's bin/python")
    return version, python


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not positive; pass 1 or more")
    return value


def _suite_test(text: str) -> str:
    try:
        split_test(text)
    except SelectionError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix(f"--test {text!r}: ")) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchmatrix", description="Run PyTorch training-correctness suites over a matrix of cells."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    listing = commands.add_parser("list", help="print the cells the filters select")
    _add_selection(listing)
    listing.add_argument(
        "--json", action="store_true", help="print JSON: versions, baseline and the cells with their axis values"
    )

    run = commands.add_parser("run", help="run the selected cells of one torch version in this environment")
    _add_selection(run)
    run.add_argument(
        "--torch",
        required=True,
        metavar="VERSION",
        help="a version from matrix.toml, or 'system' for the torch installed here",
    )
    run.add_argument(
        "--reports",
        default=None,
        metavar="DIR",
        help="where run directories go (default: reports/ next to matrix.toml)",
    )
    run.add_argument("--run-id", default=None, help="run directory name; nox passes one so all versions land together")
    run.add_argument(
        "--restart",
        action="store_true",
        help="the run id was used before (a requeued job): delete what that attempt left for this torch version and start clean",
    )
    run.add_argument(
        "--suite",
        dest="suites",
        action="append",
        default=[],
        metavar="NAME",
        help=f"run only this suite of matrix.toml (repeatable), e.g. --suite {EXAMPLE_SUITE}",
    )
    run.add_argument(
        "--test",
        dest="tests",
        action="append",
        default=[],
        type=_suite_test,
        metavar="SUITE::TEST",
        help=f"run only this test of the selected cells (repeatable), e.g. --test {example_test()}; "
        "a function name runs every parametrization of it, TEST[name=value] one of them",
    )
    run.add_argument("--install-log", type=Path, default=None, help=argparse.SUPPRESS)
    run.add_argument(
        "--report-follows",
        action="store_true",
        help="a report step runs after this one (nox passes it): the closing lines say so instead of naming the command",
    )
    run.add_argument(
        "--cross-version-reads",
        action="store_true",
        help="load the other torch versions' cross_version checkpoints of this run (cross-read passes it)",
    )
    run.add_argument(
        "--progress-part",
        type=_progress_part,
        default=(1, 1),
        metavar="K/N",
        help="this torch version is the K-th of N one invocation runs (nox passes it): the [k/N] count and the ETA continue across them",
    )
    run.add_argument(
        "--progress-since",
        type=float,
        default=None,
        metavar="EPOCH",
        help="when that invocation started, in seconds since the epoch (nox passes it): elapsed time and ETA count from it",
    )
    run.add_argument(
        "--progress-installs-after",
        type=_seconds_or_unknown,
        default=0.0,
        metavar="SECONDS",
        help="the torch versions after this one take SECONDS to install, estimated from their downloads, or 'unknown' (nox passes it): the ETA counts them",
    )
    run.add_argument(
        "--slots",
        type=_positive,
        default=None,
        help="ranks that may run at once on a CPU-only machine (default: its cores); GPUs are the slots on CUDA",
    )
    run.add_argument(
        "--confirm-limit",
        type=_non_negative,
        default=DEFAULT_CONFIRM_LIMIT,
        metavar="N",
        help=f"re-run at most N failed tests alone, each in a fresh process, to tell real failures from order-dependent ones (default {DEFAULT_CONFIRM_LIMIT}; 0: off)",
    )
    run.add_argument(
        "--max-cpu-ranks",
        type=_positive,
        default=DEFAULT_MAX_CPU_RANKS,
        metavar="N",
        help=f"on a CPU-only machine, refuse cells wider than N simulated ranks (default {DEFAULT_MAX_CPU_RANKS}; each is a process)",
    )
    run.add_argument(
        "--output-cap",
        type=_positive,
        default=DEFAULT_CAP_BYTES,
        metavar="BYTES",
        help=f"keep at most this much of each test's stdout, stderr and failure text (head and tail; default {DEFAULT_CAP_BYTES})",
    )
    run.add_argument(
        "--gpus-per-node",
        type=_positive,
        default=None,
        help="GPUs per node (default: the GPUs seen here; no limit on CPU)",
    )
    run.add_argument(
        "--multinode-launcher",
        default=None,
        metavar="CMD",
        help="runs cells wider than a node, e.g. 'srun --nodes={nnodes} torchrun --nnodes={nnodes} --nproc-per-node={nproc_per_node} ...'",
    )

    sensitivity = commands.add_parser(
        "sensitivity",
        help="wrap the configured components in generic mutants and show which ones the suites catch; exit 1 on a miss",
    )
    _add_selection(sensitivity)
    sensitivity.add_argument(
        "--torch", default="system", metavar="VERSION", help="a version from matrix.toml, or 'system' (default)"
    )
    sensitivity.add_argument(
        "--mutants",
        default=None,
        metavar="A,B",
        help=f"only these mutants (default all: {', '.join(m.name for m in GENERIC_MUTANTS)})",
    )
    sensitivity.add_argument(
        "--reports",
        default=None,
        metavar="DIR",
        help="where its directory goes (default: reports/ next to matrix.toml)",
    )
    sensitivity.add_argument("--slots", type=_positive, default=None, help="as for run")

    report = commands.add_parser(
        "report", help="write a run directory's junit.xml, results.json, summary.md and summary.html"
    )
    report.add_argument(
        "run_dir", nargs="?", default="reports/latest", help="a run directory (default: reports/latest)"
    )
    report.add_argument(
        "--config", default=None, help="matrix file for baseline and thresholds (default: the one plan.json names)"
    )
    report.add_argument(
        "--check-upgrade",
        action="store_true",
        help="exit 1 when an upgrade diff of the run is not clean (what compare exits 1 on, and a broken checkpoint direction)",
    )
    cross_read = commands.add_parser(
        "cross-read",
        help="each torch version of a run loads the checkpoints the other versions wrote (cross_version); exit 1 on a failed load",
    )
    cross_read.add_argument("run_dir", type=Path, help="a run directory whose versions ran the cross_version suite")
    cross_read.add_argument(
        "--config",
        default="matrix.toml",
        help="this machine's matrix file, whose components read (default: ./matrix.toml; never the run's own)",
    )
    cross_read.add_argument(
        "--envdir",
        type=Path,
        default=None,
        help="nox's envdir whose gpu_matrix venvs read, one per torch version (default: .nox next to matrix.toml)",
    )
    cross_read.add_argument(
        "--python",
        dest="interpreters",
        action="append",
        default=[],
        type=_interpreter,
        metavar="VERSION=PATH",
        help="the interpreter that reads for this torch version instead of its gpu_matrix venv (repeatable)",
    )
    compare = commands.add_parser("compare", help="upgrade diff of run B against run A; exit 1 on a regression")
    compare.add_argument("run_a", type=Path, help="the reference run: a run directory or its results.json")
    compare.add_argument("run_b", type=Path, help="the run to check against it")
    compare.add_argument("--out", type=Path, default=None, help="also write the diff (markdown) to this file")
    bisect = commands.add_parser(
        "bisect",
        help="find the first torch release between two pins where a regression appears; exit 1 when a search has no answer",
    )
    _add_selection(bisect)
    bisect.add_argument("--good", metavar="VERSION", help="a torch release the selected tests pass on (the older pin)")
    bisect.add_argument("--bad", metavar="VERSION", help="a torch release they fail on (the newer pin)")
    bisect.add_argument(
        "--from",
        dest="from_run",
        type=Path,
        metavar="RUN",
        help="bisect the confirmed regressions of this run directory's upgrade diff (instead of --good/--bad)",
    )
    bisect.add_argument(
        "--envdir",
        type=Path,
        default=None,
        help="nox's envdir whose gpu_matrix venvs the steps use and add to (default: .nox next to matrix.toml)",
    )
    bisect.add_argument(
        "--reports",
        default=None,
        metavar="DIR",
        help="where the report goes without --from (default: reports/ next to matrix.toml)",
    )
    bisect.add_argument("--slots", type=_positive, default=None, help="as for run")
    repro = commands.add_parser(
        "repro",
        help="write a standalone reproducer (script, command, environment, bug-report README) of a confirmed failure",
    )
    repro.add_argument("run_dir", type=Path, help="the run directory (reports/<run-id>)")
    repro.add_argument("test_id", metavar="TORCH/CELL/SUITE::TEST", help="the failure, as the summary page names it")
    repro.add_argument("--out", type=Path, default=None, help="the directory to write (default: RUN/repro/<test id>)")
    repro.add_argument(
        "--python",
        default=None,
        help="the interpreter of that torch, for collect_env and a cross_version read's reading side (default: its gpu_matrix venv in .nox, else this one)",
    )
    repro.add_argument(
        "--writer-python",
        default=None,
        help="for a cross_version read: the interpreter of the torch that wrote the checkpoint (default: its gpu_matrix venv in .nox)",
    )
    repro.add_argument("--config", default=None, help="the run's matrix file (default: the one its plan.json names)")
    merge = commands.add_parser("merge", help="merge report directories of shards, jobs and versions into one run")
    _add_selection(merge)
    merge.add_argument(
        "inputs", nargs="+", type=Path, metavar="DIR", help="report directories (e.g. downloaded artifacts)"
    )
    merge.add_argument("--out", required=True, type=Path, help="the merged run directory to write")
    merge.add_argument(
        "--versions", default=None, metavar="V1,V2", help="torch versions to expect (default: all in matrix.toml)"
    )

    fan_out = commands.add_parser(
        "github-matrix", help="print the GitHub Actions job matrix: one job per torch version and shard"
    )
    _add_selection(fan_out)
    fan_out.add_argument("--shards", type=_positive, default=1, help="shards per torch version (default 1)")
    slurm = commands.add_parser(
        "slurm", help="write sbatch scripts: an array job per shard, multi-node jobs, a merge job"
    )
    _add_selection(slurm)
    slurm.add_argument(
        "--shards", type=_positive, default=1, help="shards per torch version for cells that fit on one node"
    )
    slurm.add_argument("--gpus-per-node", type=_positive, required=True, help="GPUs per node; wider cells span nodes")
    slurm.add_argument("--partition", default=None, help="sbatch --partition")
    slurm.add_argument("--time", default="04:00:00", help="sbatch --time per job (default 04:00:00)")
    slurm.add_argument("--rdzv-port", type=_positive, default=29500, help="torchrun rendezvous port on the first node")
    slurm.add_argument(
        "--out", type=Path, default=Path("reports/slurm"), help="where the scripts go (default reports/slurm)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "report":
            return _report(Path(args.run_dir), args.config, check_upgrade=args.check_upgrade)
        if args.command == "compare":
            return _compare(args.run_a, args.run_b, args.out)
        if args.command == "cross-read":
            return _cross_read(args)
        if args.command == "repro":
            return _repro(args)
        matrix = load_matrix(args.config)
        if args.command == "list":
            return _list(matrix, args)
        if args.command == "merge":
            return _merge(matrix, args)
        if args.command == "github-matrix":
            return _github_matrix(matrix, args)
        if args.command == "slurm":
            return _slurm(matrix, args)
        if args.command == "sensitivity":
            return _sensitivity(matrix, args)
        if args.command == "bisect":
            return _bisect(matrix, args)
        return _run(matrix, args)
    except UserError as error:
        print(f"torchmatrix: error: {error}", file=sys.stderr)
        return error.exit_code
    except BrokenPipeError:
        if args.command not in PRINTING_COMMANDS:
            raise
        _drop_stdout()
        return ExitCode.PASSED


PRINTING_COMMANDS = ("list", "github-matrix")
"""Commands whose whole job is printing: a reader that stops early (`list --json | head -3`) got what it asked for."""


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the flush at exit does not hit the closed pipe again (the
    recipe of Python's signal docs for SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _filters(matrix: Matrix, args) -> dict:
    """The selection flags, parsed and checked against the matrix."""
    return {
        "only": parse_only(args.only, matrix.axes),
        "keyword": args.keyword,
        "shard": Shard.parse(args.shard) if args.shard else None,
    }


def _list(matrix: Matrix, args) -> int:
    cells = matrix.select(**_filters(matrix, args))
    if args.json:
        print(
            json.dumps(
                {
                    "versions": list(matrix.versions),
                    "baseline": matrix.baseline,
                    "cells": [{"id": c.id, **c.to_json()} for c in cells],
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


def _run(matrix: Matrix, args) -> int:
    if args.torch not in matrix.versions and args.torch != "system":
        raise RunError(
            f"--torch {args.torch}: not in [torch].versions of {matrix.path.name} ({', '.join(matrix.versions)}); add it there or pass --torch system"
        )
    request = RunRequest(
        matrix=matrix,
        version=args.torch,
        reports=Path(args.reports).resolve() if args.reports else matrix.root / "reports",
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
        selection=SuiteSelection(tuple(args.suites), tuple(args.tests)),
        **_filters(matrix, args),
    )
    code = run_version(request)
    if not request.cross_version_reads:
        print(run_closing_lines(request.run_dir, failed=code == ExitCode.FAILED, report_follows=args.report_follows))
    return code


def _cross_read(args) -> int:
    if not args.run_dir.is_dir():
        raise RunError(f"{args.run_dir} is not a run directory; pass one under reports/, e.g. reports/latest")
    matrix = load_matrix(args.config)
    envdir = (args.envdir or matrix.root / ".nox").resolve()
    return read_pass(args.run_dir.resolve(), matrix, envdir, dict(args.interpreters))


def _sensitivity(matrix: Matrix, args) -> int:
    if args.torch not in matrix.versions and args.torch != "system":
        raise RunError(
            f"--torch {args.torch}: not in [torch].versions of {matrix.path.name}; pass one of them or system"
        )
    filters = _filters(matrix, args)
    if filters["shard"]:
        raise SelectionError(
            "sensitivity: --shard does not apply; it picks its own few cells (narrow them with --only, -k)"
        )
    reports = Path(args.reports).resolve() if args.reports else matrix.root / "reports"
    out = reports / f"sensitivity-{new_run_id()}"
    try:
        return run_sensitivity(
            matrix, version=args.torch, out=out, filters=filters, mutant_names=args.mutants, slots=args.slots
        )
    except KeyboardInterrupt:
        print(f"torchmatrix sensitivity: interrupted; the finished runs are under {out / 'runs'}", file=sys.stderr)
        return ExitCode.INTERRUPTED


def _bisect(matrix: Matrix, args) -> int:
    if importlib.util.find_spec("nox") is None:
        raise RunError("bisect makes gpu_matrix's venvs with nox, which this environment lacks; pip install nox")
    filters = _filters(matrix, args)
    if filters["shard"]:
        raise SelectionError("bisect: --shard does not apply; narrow the cells with --only and -k")
    if args.from_run is not None and (args.good or args.bad or args.only or args.keyword):
        raise SelectionError("bisect: --from RUN takes the run's regressions; drop --good, --bad, --only and -k")
    if args.from_run is None and not (args.good and args.bad):
        raise SelectionError("bisect: pass --good VERSION and --bad VERSION, or --from RUN")
    if args.from_run is not None and not args.from_run.is_dir():
        raise RunError(f"--from {args.from_run} is not a run directory; pass one under reports/, e.g. reports/latest")
    matrix.select(**filters)  # a selection that keeps no cell is refused here, before any install
    if args.from_run is None:
        between(args.good, args.bad, [])  # so are pins that are not versions, or out of order
    envdir = _directory_to_write((args.envdir or matrix.root / ".nox").resolve(), "--envdir")
    reports = _directory_to_write(
        Path(args.reports).resolve() if args.reports else matrix.root / "reports", "--reports"
    )
    request = BisectRequest(
        matrix=matrix,
        envdir=envdir,
        reports=reports,
        good=args.good,
        bad=args.bad,
        from_run=args.from_run.resolve() if args.from_run else None,
        filters=[f"--only={text}" for text in args.only] + (["-k", args.keyword] if args.keyword else []),
        slots=args.slots,
    )
    try:
        return run_bisect(request)
    except KeyboardInterrupt:
        print("torchmatrix bisect: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED


def _directory_to_write(path: Path, flag: str) -> Path:
    """`path` when it is a directory or can become one; a file there, or above it, is refused in one line."""
    existing = next(parent for parent in [path, *path.parents] if parent.exists())
    if not existing.is_dir():
        raise RunError(f"{flag} {path}: {existing} is a file, not a directory; pass a directory")
    return path


def _repro(args) -> int:
    if not args.run_dir.is_dir():
        raise RunError(f"{args.run_dir} is not a run directory; pass one under reports/, e.g. reports/latest")
    written = write_reproducer(
        args.run_dir.resolve(),
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


def _report(run_dir: Path, config: str | None = None, *, check_upgrade: bool = False) -> int:
    if not run_dir.is_dir():
        raise RunError(f"{run_dir} is not a run directory; pass one under reports/, e.g. reports/latest")
    try:
        written = write_report(run_dir.resolve(), config)
    except OSError as error:
        raise RunError(f"cannot write the reports of {run_dir}: {_write_failure(error)}") from None
    print(f"torchmatrix: wrote {', '.join(str(path) for path in written)}")
    run = load_run(run_dir.resolve(), config)
    print(closing_lines(run, run_dir.resolve()))
    unclean = [diff for diff in upgrade_diffs(run) if diff.fails]
    for diff in unclean if check_upgrade else []:
        causes = ", ".join(cause.name for cause in diff.fail_causes)
        print(
            f"torchmatrix: upgrade diff {diff.before} → {diff.after} is not clean ({causes}); see the summary",
            file=sys.stderr,
        )
    return ExitCode.FAILED if check_upgrade and unclean else ExitCode.PASSED


def _compare(run_a: Path, run_b: Path, out: Path | None = None) -> int:
    if out is not None and out.is_dir():
        raise CompareError(f"--out {out} is a directory; name a file, e.g. --out {out / 'compare.md'}")
    if out is not None and not out.parent.is_dir():
        raise CompareError(
            f"--out {out}: the directory {out.parent} does not exist; create it or name a file in one that does"
        )
    markdown, causes = compare_markdown(run_a, run_b)
    print(markdown)
    if out is not None:
        try:
            file_writes.write_text(out, markdown + "\n")
        except OSError as error:
            raise CompareError(f"--out {out}: {_write_failure(error)}") from None
        print(f"torchmatrix: wrote {out}")
    append_step_summary(markdown)
    return ExitCode.FAILED if causes else ExitCode.PASSED


def _write_failure(error: OSError) -> str:
    """What stopped a write, naming the file in the way (a rename names its target second)."""
    where = error.filename2 or error.filename
    if isinstance(error, IsADirectoryError):
        return f"{where} is a directory where a file goes; remove it, then run this again"
    return f"{error.strerror or error}: {where}" if where else str(error.strerror or error)


def _merge(matrix: Matrix, args) -> int:
    versions = (
        [check_name(v.strip(), "--versions entry") for v in args.versions.split(",") if v.strip()]
        if args.versions
        else None
    )
    out = args.out.resolve()
    filters = _filters(matrix, args)
    if filters["shard"]:
        raise SelectionError("merge: pass the filters the jobs shared (--only, -k), not --shard")
    expected = matrix.select(**filters)
    result = merge_reports([path.resolve() for path in args.inputs], out, matrix, expected=expected, versions=versions)
    for version, missing in result.missing.items():
        print(
            f"torchmatrix: torch {version}: {len(missing)} planned cells had no report: {', '.join(missing)}",
            file=sys.stderr,
        )
    cells = ", ".join(f"torch {v}: {n} cells" for v, n in result.cells.items())
    print(f"torchmatrix: merged {result.inputs} report directories into {out} ({cells})")
    _report(out)
    return ExitCode.FAILED if junit.has_problems(out / junit.MERGED_NAME) else ExitCode.PASSED


def _fan_out_filters(matrix: Matrix, args) -> tuple[dict, list[str]]:
    """Filters of a fan-out command, parsed, and as the arguments each job passes on."""
    filters = _filters(matrix, args)
    if filters["shard"]:
        raise SelectionError(f"{args.command}: use --shards N, not --shard; every job gets its own --shard i/N")
    return filters, [f"--only={text}" for text in args.only] + (["-k", args.keyword] if args.keyword else [])


def _github_matrix(matrix: Matrix, args) -> int:
    filters, filter_args = _fan_out_filters(matrix, args)
    print(
        json.dumps(
            github_matrix(matrix, args.shards, only=filters["only"], keyword=args.keyword, filter_args=filter_args)
        )
    )
    return ExitCode.PASSED


def _slurm(matrix: Matrix, args) -> int:
    filters, filter_args = _fan_out_filters(matrix, args)
    options = SlurmOptions(args.shards, args.gpus_per_node, args.partition, args.time, args.rdzv_port)
    out = args.out if args.out.is_absolute() else matrix.root / args.out
    scripts = write_slurm(matrix, options, out, only=filters["only"], keyword=args.keyword, filter_args=filter_args)
    print(f"torchmatrix: wrote {', '.join(p.name for p in scripts)} to {out}; submit with {out / 'submit.sh'}")
    return ExitCode.PASSED
