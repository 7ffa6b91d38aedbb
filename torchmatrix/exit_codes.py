"""The exit codes every command returns (`ExitCode`); what each means per command is the table in
torchmatrix/exit_code_table.py, which docs/reference/exit-codes.md is rendered from."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a command exits with."""

    PASSED = 0
    FAILED = 1  # a test failed, or a diff is not clean
    USAGE = 2  # a usage or input error, said in one line
    INTERRUPTED = 130  # Ctrl-C or SIGTERM (128 + SIGINT)
