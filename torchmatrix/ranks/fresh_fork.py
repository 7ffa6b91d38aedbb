"""A forked process that goes on as a started one would: with only the files it was handed open,
and leaving with the exit code SystemExit asked for (the zygote, and the run's pytest forks)."""

from __future__ import annotations

import contextlib
import os


def close_files_except(keep: set[int]) -> None:
    """Close every descriptor this process holds but `keep` (the parent's pipes, sockets and logs)."""
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def exit_code(exit: SystemExit) -> int:
    """The status an interpreter leaves with for this SystemExit: its int, else 1 for a message, 0 for None."""
    return exit.code if isinstance(exit.code, int) else int(exit.code is not None)
