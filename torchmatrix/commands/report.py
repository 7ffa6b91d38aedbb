"""`torchmatrix report`: a run directory's junit.xml, results.json, summary.md and summary.html."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from torchmatrix.commands.paths import run_directory, write_failure
from torchmatrix.exit_codes import ExitCode
from torchmatrix.reports.closing import closing_lines
from torchmatrix.reports.prerelease import add_flag, with_flag
from torchmatrix.reports.report import load_run
from torchmatrix.reports.upgrade_diff import upgrade_diffs
from torchmatrix.run.recovery import rebuild_and_report
from torchmatrix.run.run_request import RunError

NAME = "report"


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        NAME, help="write a run directory's junit.xml, results.json, summary.md and summary.html"
    )
    parser.add_argument(
        "run_dir", nargs="?", default="reports/latest", help="a run directory (default: reports/latest)"
    )
    parser.add_argument(
        "--config", default=None, help="matrix file for baseline and thresholds (default: the one plan.json names)"
    )
    parser.add_argument(
        "--check-upgrade",
        action="store_true",
        help="exit 1 when an upgrade diff of the run is not clean (what compare exits 1 on, and a broken checkpoint direction)",
    )
    add_flag(parser, "with --check-upgrade, a nightly or rc candidate's unclean diff")
    return parser


def run(args: argparse.Namespace) -> ExitCode:
    return report_run(
        Path(args.run_dir), args.config, check_upgrade=args.check_upgrade, prerelease_blocks=args.prerelease_blocks
    )


def report_run(
    run_dir: Path, config: str | None = None, *, check_upgrade: bool = False, prerelease_blocks: bool = False
) -> ExitCode:
    """Write the reports of `run_dir` and print its closing lines; FAILED only for an unclean upgrade
    diff that `check_upgrade` asks about (a pre-release candidate's only where it blocks)."""
    resolved = run_directory(run_dir).resolve()
    try:
        written = rebuild_and_report(resolved, config)
    except OSError as error:
        raise RunError(f"cannot write the reports of {run_dir}: {write_failure(error)}") from None
    print(f"torchmatrix: wrote {', '.join(str(path) for path in written)}")
    run = load_run(resolved, config)
    run.settings = with_flag(run.settings, prerelease_blocks)
    print(closing_lines(run, resolved))
    unclean = [diff for diff in upgrade_diffs(run) if diff.fails and diff.blocks]
    for diff in unclean if check_upgrade else []:
        causes = ", ".join(cause.name for cause in diff.fail_causes)
        print(
            f"torchmatrix: upgrade diff {diff.before} → {diff.after} is not clean ({causes}); see the summary",
            file=sys.stderr,
        )
    return ExitCode.FAILED if check_upgrade and unclean else ExitCode.PASSED
