"""Pre-release builds (the channel values nightly, nightly-YYYYMMDD, rc) apart from the pin bump:
a failed run of one exits 0 unless `[report] prerelease_blocks` or `--prerelease-blocks` says it
blocks, since a nightly breaks more often than a bump should stop on."""

from __future__ import annotations

import sys
from dataclasses import replace

from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.channels import UNBLOCK_HINT, channel_of
from torchmatrix.matrix.config import ReportSettings


def add_flag(parser, blocked: str) -> None:
    """`--prerelease-blocks` on a command's parser; `blocked` says what of a pre-release then exits 1."""
    parser.add_argument(
        "--prerelease-blocks",
        action="store_true",
        help=f"{blocked} exits 1 as any other does (as [report] prerelease_blocks = true)",
    )


def with_flag(settings: ReportSettings, flag: bool) -> ReportSettings:
    """The settings with `--prerelease-blocks` applied (the flag only ever turns blocking on)."""
    return replace(settings, prerelease_blocks=True) if flag else settings


def merged_exit(failed_versions: list[str], settings: ReportSettings) -> ExitCode:
    """A merged run's exit code: FAILED where a version failed, unless every one that did is a
    pre-release build that does not block."""
    return max((run_exit(version, ExitCode.FAILED, settings) for version in failed_versions), default=ExitCode.PASSED)


def run_exit(version: str, code: ExitCode, settings: ReportSettings) -> ExitCode:
    """A run's exit code: a failed pre-release run says so and exits 0 unless it blocks."""
    if code != ExitCode.FAILED or channel_of(version) is None or settings.prerelease_blocks:
        return code
    print(
        f"torchmatrix: torch {version} is a pre-release build: its failures do not block; {UNBLOCK_HINT}",
        file=sys.stderr,
    )
    return ExitCode.PASSED
