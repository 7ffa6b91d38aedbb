"""Children that end when their parent dies, so a runner killed with SIGKILL leaves nothing behind.

On Linux the kernel does it (prctl PR_SET_PDEATHSIG): the process gets SIGKILL the moment the
thread that started it exits. Elsewhere a daemon thread polls the parent's pid. Either way a
parent that is already gone by the time this runs (it died while the child started) is caught
by comparing the parent pid with the one the parent passed down.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PARENT_PID_VARIABLE = "TORCHMATRIX_PARENT_PID"
PR_SET_PDEATHSIG = 1
WATCH_INTERVAL_S = 1.0


def exit_with_parent(parent_pid: int | None = None) -> None:
    """Die with SIGKILL when the parent dies; `parent_pid` (default: the current parent) is the
    process that must still be alive, or this one exits now."""
    parent_pid = parent_pid or os.getppid()
    if not _kernel_kills_on_parent_death():
        threading.Thread(target=_watch, args=(parent_pid,), daemon=True, name="torchmatrix-parent-watch").start()
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)


def exit_with_runner() -> None:
    """For a process the runner started directly: follow the runner's pid it was given, if any."""
    parent = os.environ.get(PARENT_PID_VARIABLE)
    if parent and parent.isdigit():
        exit_with_parent(int(parent))


def _kernel_kills_on_parent_death() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(WATCH_INTERVAL_S)
    os.kill(os.getpid(), signal.SIGKILL)
