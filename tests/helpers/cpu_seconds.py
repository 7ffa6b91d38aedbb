"""Per-test CPU seconds (this process and every child it reaped), written as JSON lines when
TORCHMATRIX_TEST_CPU_LOG names a file: CI's cost measured independently of the machine's load."""

from __future__ import annotations

import json
import os
import time

import pytest

LOG_VARIABLE = "TORCHMATRIX_TEST_CPU_LOG"


def cpu_seconds() -> float:
    """User and system time of this process and of its reaped children, together."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    log = os.environ.get(LOG_VARIABLE)
    if not log:
        yield
        return
    cpu_before, wall_before = cpu_seconds(), time.monotonic()
    yield
    record = {
        "test": item.nodeid,
        "cpu_s": round(cpu_seconds() - cpu_before, 2),
        "wall_s": round(time.monotonic() - wall_before, 2),
    }
    with open(log, "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
