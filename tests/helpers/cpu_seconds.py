"""Per-test CPU seconds of the pytest process and every descendant, written as JSON lines when
TORCHMATRIX_TEST_CPU_LOG names a file: CI's cost measured independently of the machine's load.

- Rank processes are children of a forkserver nobody waits for; as a child subreaper (Linux) this
  process adopts such orphans and reaps them after each test, so their CPU counts too.
- Measurement only: reaping every exited child could take an exit status from a fixture's process
  that was not waited for yet, so nothing of this runs without the variable.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time

import pytest

LOG_VARIABLE = "TORCHMATRIX_TEST_CPU_LOG"
PR_SET_CHILD_SUBREAPER = 36


def cpu_seconds() -> float:
    """User and system time of this process and of its reaped children, together."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def reap_exited_children() -> None:
    """Wait for every child that has exited (adopted orphans among them), adding their CPU times."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def pytest_configure(config):
    if os.environ.get(LOG_VARIABLE) and sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    log = os.environ.get(LOG_VARIABLE)
    if not log:
        yield
        return
    cpu_before, wall_before = cpu_seconds(), time.monotonic()
    yield
    reap_exited_children()
    record = {
        "test": item.nodeid,
        "cpu_s": round(cpu_seconds() - cpu_before, 2),
        "wall_s": round(time.monotonic() - wall_before, 2),
    }
    with open(log, "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
