"""`torchmatrix merge`: report directories of shards, jobs and versions merged into one run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from torchmatrix.commands.paths import write_failure
from torchmatrix.commands.report import report_run
from torchmatrix.commands.selection_flags import add_selection_flags, cell_selection
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.config import load_matrix
from torchmatrix.matrix.safe_names import check_name
from torchmatrix.reports import junit
from torchmatrix.reports.prerelease import add_flag, merged_exit, with_flag
from torchmatrix.run.run_request import RunError
from torchmatrix.scale.merge import MergeError, merge_reports, removed_unless_whole

NAME = "merge"
SHARD_REFUSAL = "merge: pass the filters the jobs shared (--only, -k), not --shard"


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(NAME, help="merge report directories of shards, jobs and versions into one run")
    add_selection_flags(parser)
    parser.add_argument(
        "inputs", nargs="+", type=Path, metavar="DIR", help="report directories (e.g. downloaded artifacts)"
    )
    parser.add_argument("--out", required=True, type=Path, help="the merged run directory to write")
    parser.add_argument(
        "--versions", default=None, metavar="V1,V2", help="torch versions to expect (default: all in matrix.toml)"
    )
    add_flag(parser, "a failure on a nightly or rc value")
    return parser


def run(args: argparse.Namespace) -> ExitCode:
    matrix = load_matrix(args.config)
    versions = (
        [check_name(v.strip(), "--versions entry") for v in args.versions.split(",") if v.strip()]
        if args.versions
        else None
    )
    out = args.out.resolve()
    expected = matrix.select(cell_selection(args, matrix, shard_refusal=SHARD_REFUSAL))
    inputs = [path.resolve() for path in args.inputs]
    try:
        with removed_unless_whole(out):
            _merge_and_report(inputs, out, matrix, expected, versions)
    except OSError as error:
        raise MergeError(_unwritable(out, write_failure(error))) from None
    except RunError as error:  # the reports of the merged run could not be written
        raise MergeError(_unwritable(out, str(error))) from None
    return merged_exit(failed_versions(out), with_flag(matrix.report, args.prerelease_blocks))


def failed_versions(run_dir: Path) -> list[str]:
    """The torch versions of a run directory with a failure or error in their cells' reports (reads included)."""
    return [
        folder.name.removeprefix("torch-")
        for folder in sorted(run_dir.glob("torch-*"))
        if any(junit.has_problems(report) for report in folder.rglob("*.xml"))
    ]


def _merge_and_report(inputs: list[Path], out: Path, matrix, expected, versions: list[str] | None) -> None:
    result = merge_reports(inputs, out, matrix, expected=expected, versions=versions)
    for version, missing in result.missing.items():
        print(
            f"torchmatrix: torch {version}: {len(missing)} planned cells had no report: {', '.join(missing)}",
            file=sys.stderr,
        )
    cells = ", ".join(f"torch {v}: {n} cells" for v, n in result.cells.items())
    print(f"torchmatrix: merged {result.inputs} report directories into {out} ({cells})")
    report_run(out)


def _unwritable(out: Path, reason: str) -> str:
    """The one line of a merge a full or read-only disk stopped, whose partial output is gone."""
    return f"cannot write the merged run to {out} ({reason}); nothing was left there: make room or pass another --out, then merge again"
