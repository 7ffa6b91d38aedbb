"""A forked process that goes on as a started one would: with only the files it was handed open,
and leaving with the status an interpreter would (the zygote, and the run's preloaded forks)."""

from __future__ import annotations

import contextlib
import os
import random
import sys
import traceback
from collections.abc import Callable


def reseed_global_generators() -> None:
    """Seed Python's `random` and numpy's global generator from the OS, as a started process's are:
    every fork of one interpreter would otherwise draw the same numbers, so a failure that hangs on
    a random draw would read as 'fails alone' in every re-run."""
    random.seed()
    numpy_random = sys.modules.get("numpy.random")  # not imported yet: the child's import seeds it
    if numpy_random is not None:
        numpy_random.seed()


def close_files_except(keep: set[int]) -> None:
    """Close every descriptor this process holds but `keep` (the parent's pipes, sockets and logs)."""
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def run_then_leave(run: Callable[[], None], leave: Callable[[int], None] = os._exit) -> None:
    """run(), then leave(status) as an interpreter's exit would have it: 0, SystemExit's code (1 for
    a message), or 1 after printing an exception's traceback; never back into the parent's code."""
    code = 1
    try:
        run()
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        leave(code)
