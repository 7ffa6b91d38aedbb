"""Nothing a run starts may outlive it: a test's child process, a rank's, or one that left its
parent's session (setsid) or lost its parent. The runner becomes a child subreaper, so every
such process stays below it in the process tree, and when the run ends each one left is killed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
SWEEPS = 5  # a process forking while it is killed leaves children for the next sweep


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (read from /proc before a parent dies and its children are re-parented)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, frontier = [], [pid]
    while frontier:
        below = [child for parent in frontier for child in children.get(parent, [])]
        found += below
        frontier = below
    return found


def adopt_orphans() -> None:
    """Make this process the one orphans below it are re-parented to (Linux), so `kill_leftovers` finds them."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def adopts_orphans() -> bool:
    """Whether orphans below this process are re-parented to it (`adopt_orphans` ran, on Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    flag = ctypes.c_int(0)
    asked = ctypes.CDLL(None, use_errno=True).prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    return asked == 0 and flag.value != 0


def kill_leftovers() -> int:
    """SIGKILL every process still below this one, reap those that became its children; return how many."""
    killed = 0
    for _ in range(SWEEPS):
        left = descendants(os.getpid())
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        reap_children()
    return killed


def reap_children(*, wait: bool = True) -> None:
    """Collect the exit of every child that ended, so none stays a zombie (and its CPU time reaches
    RUSAGE_CHILDREN); `wait=False` takes only those already ended, never blocking."""
    while True:
        try:
            pid, _ = os.waitpid(-1, 0 if wait else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
