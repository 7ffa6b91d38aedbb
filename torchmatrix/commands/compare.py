"""`torchmatrix compare`: the upgrade diff of run B against run A."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.commands.paths import write_failure
from torchmatrix.exit_codes import ExitCode
from torchmatrix.reports.report import append_step_summary, compare_markdown
from torchmatrix.reports.upgrade_diff import CompareError

NAME = "compare"


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(NAME, help="upgrade diff of run B against run A; exit 1 on a regression")
    parser.add_argument("run_a", type=Path, help="the reference run: a run directory or its results.json")
    parser.add_argument("run_b", type=Path, help="the run to check against it")
    parser.add_argument("--out", type=Path, default=None, help="also write the diff (markdown) to this file")
    return parser


def run(args: argparse.Namespace) -> ExitCode:
    out = args.out
    if out is not None and out.is_dir():
        raise CompareError(f"--out {out} is a directory; name a file, e.g. --out {out / 'compare.md'}")
    if out is not None and not out.parent.is_dir():
        raise CompareError(
            f"--out {out}: the directory {out.parent} does not exist; create it or name a file in one that does"
        )
    markdown, causes = compare_markdown(args.run_a, args.run_b)
    print(markdown)
    if out is not None:
        try:
            file_writes.write_text(out, markdown + "\n")
        except OSError as error:
            raise CompareError(f"--out {out}: {write_failure(error)}") from None
        print(f"torchmatrix: wrote {out}")
    append_step_summary(markdown)
    return ExitCode.FAILED if causes else ExitCode.PASSED
