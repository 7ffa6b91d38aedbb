"""Per-test CPU seconds of the pytest process and every descendant, written as JSON lines when
TORCHMATRIX_TEST_CPU_LOG names a file: CI's cost measured independently of the machine's load.

- Rank processes are children of a forkserver nobody waits for; as a child subreaper (Linux) this
  process adopts such orphans and reaps them after each test, so their CPU counts too.
- A command run in a fork of a server (helpers/cli_forks.py) is the server's child: its CPU seconds
  come back with its exit code and count here too.
- Measurement only: reaping every exited child could take an exit status from a fixture's process
  that was not waited for yet, so nothing of this runs without the variable.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from torchmatrix.forks.leftover_processes import adopt_orphans, reap_children
from torchmatrix.ranks.per_test_usage import process_cpu_seconds

from helpers import cli_forks

LOG_VARIABLE = "TORCHMATRIX_TEST_CPU_LOG"


def pytest_configure(config):
    if os.environ.get(LOG_VARIABLE):
        adopt_orphans()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    log = os.environ.get(LOG_VARIABLE)
    if not log:
        yield
        return
    cpu_before, wall_before = cpu_seconds(), time.monotonic()
    yield
    reap_children(wait=False)
    record = {
        "test": item.nodeid,
        "cpu_s": round(cpu_seconds() - cpu_before, 2),
        "wall_s": round(time.monotonic() - wall_before, 2),
    }
    with open(log, "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


def cpu_seconds() -> float:
    """This process's, its reaped children's and its servers' commands' CPU seconds."""
    return process_cpu_seconds() + cli_forks.forked_cpu_seconds
