"""The tests' CPU seconds are counted once per execution: their sum stays within what the run's
processes really used (getrusage of the finished children), while the per-testcase JUnit figures,
repeated for every cell a run stands for, add up to more than that."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest
from junitparser import JUnitXml

from torchmatrix.messages.events import EventReader
from torchmatrix.messages.properties import CPU_SECONDS
from torchmatrix.ranks.per_test_usage import cpu_seconds_once

from helpers.checkout import REPO, checkout_env
from helpers.matrix_files import write_matrix

pytestmark = pytest.mark.slow

BURN_SECONDS = 1.0
CELLS = ("a", "b", "c", "d", "e")
BURNING_SUITE = f"""
import time


def burn(seconds):
    until = time.process_time() + seconds
    while time.process_time() < until:
        pass


def test_first(cell, ranks):
    ranks.run(burn, {BURN_SECONDS})


def test_second(cell, ranks):
    ranks.run(burn, {BURN_SECONDS})
"""


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_cpu_seconds_count_each_execution_once_within_what_the_processes_used(tmp_path):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "test_burn.py").write_text(BURNING_SUITE)
    write_matrix(tmp_path, axes={"world_size": [1], "x": list(CELLS)}, suites={"burn": {"axes": ["world_size"]}})
    before = children_cpu_seconds()
    done = subprocess.run(
        [sys.executable, "-m", "torchmatrix", "run", "--torch", "system", "--config", str(tmp_path / "matrix.toml")],
        cwd=REPO,
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    used = children_cpu_seconds() - before
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    version_dir = tmp_path / "reports" / "latest" / "torch-system"
    events = [event for log in (version_dir / "logs").glob("*.events.jsonl") for event in EventReader(log).read_new()]
    once = cpu_seconds_once(events)
    per_testcase = sum(
        float(p.value)
        for suite in JUnitXml.fromfile(str(version_dir.parent / "junit.xml"))
        for p in suite.properties()
        if p.name.endswith(f"::{CPU_SECONDS}")
    )
    # os.times() counts in clock ticks the kernel samples, so a burn of 1 s of process_time reads 0.99 s at times
    assert 0.9 * 2 * BURN_SECONDS <= once <= used, (once, used)
    assert per_testcase == pytest.approx(len(CELLS) * once, rel=0.01), (
        "each execution repeated in every cell it stands for"
    )
    assert per_testcase > used, (
        f"the per-testcase sum ({per_testcase:.1f} s) exceeds what the processes used ({used:.1f} s)"
    )
