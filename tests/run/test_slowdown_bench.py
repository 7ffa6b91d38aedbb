"""bench/slowdown_under_load.py in its tiny mode (CI runs every bench): one torch three times, with CPU
hogs during the second run only and a 2x compute cost in one suite during the third; the slowdown
rule must flag nothing under load and exactly that suite at 2x."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO, checkout_env

pytestmark = pytest.mark.slow


def test_the_tiny_bench_flags_the_costlier_suite_and_not_the_busy_machine():
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "slowdown_under_load.py"), "--tiny", "--hogs", "4"],
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict: honest: 0 suites flagged under load, ['work'] flagged at 2x compute" in done.stdout
