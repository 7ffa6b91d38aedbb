"""A forked process that goes on as a started one would: with only the files it was handed open,
and leaving with the status an interpreter would (the zygote, and the run's preloaded forks)."""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable


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
