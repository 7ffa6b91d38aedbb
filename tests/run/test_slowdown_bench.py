"""bench/slowdown_under_load.py in its smoke mode (CI runs every bench): one torch three times, with a CPU
hog during the second run only and a 2x compute cost in one suite during the third; the slowdown
bench must run both comparisons and give its verdict (the verdict itself is a timing: the bench's figure, not CI's,
so the smoke run's tests are too short to cross the rule's floors and the hog burns only while they run)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.checkout import REPO, checkout_env

pytestmark = pytest.mark.slow

# One hog is load enough to prove the comparison runs; more only slow run B and every other test
# sharing CI's two cores with it (with 4 it took 184 s in CI).
HOGS = 1


def test_the_smoke_bench_runs_both_comparisons_and_judges():
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "slowdown_under_load.py"), "--smoke", "--hogs", str(HOGS)],
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    # The verdict is a timing on a shared machine: CI proves the bench runs end to end and judges;
    # what it judges is measured by the bench itself (docs/explanation/between-versions.md), and the
    # rule is unit-tested on recorded figures (tests/reports/test_between_versions.py).
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert f"B ({HOGS} CPU hogs) against A: load average" in done.stdout, done.stdout
    assert "C (work suite 2x compute) against A: load average" in done.stdout, done.stdout
    assert "verdict: " in done.stdout, done.stdout
