"""Overhead the rank pool adds per test: a trivial distributed test run many times.

Runs one tiny suite through `python -m torchmatrix run` at world sizes 1, 2 and 4 (one run per
world size, so they do not share the cores) and reads the per-test durations back from the
JUnit reports. The test's own work is one all_reduce of one float, so nearly all of each
duration is overhead: fixture setup, pickling the call to every rank, gathering the replies.

    python bench/per_test_overhead.py [--tests 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from junitparser import JUnitXml

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 0.1

MATRIX = """
[torch]
versions = ["system"]

[axes]
world_size = [1, 2, 4]

[suites.trivial]
path = "suites/test_trivial.py"
timeout = 60
"""

SUITE = """
import pytest
import torch
import torch.distributed as dist


def _all_reduce_one():
    value = torch.ones(1)
    dist.all_reduce(value)
    return value.item()


@pytest.mark.parametrize("repeat", range({tests}))
def test_trivial(cell, ranks, repeat):
    assert ranks.run(_all_reduce_one) == [float(cell.world_size)] * cell.world_size
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests", type=int, default=200, help="tests per world size")
    parser.add_argument("--tiny", action="store_true", help="3 tests at world size 1 (what CI runs)")
    args = parser.parse_args()
    tests, world_sizes = (3, (1,)) if args.tiny else (args.tests, (1, 2, 4))
    with tempfile.TemporaryDirectory(prefix="torchmatrix-overhead-") as tmp:
        project = Path(tmp)
        (project / "suites").mkdir()
        (project / "suites" / "__init__.py").write_text("")
        (project / "suites" / "test_trivial.py").write_text(textwrap.dedent(SUITE.format(tests=tests)))
        (project / "matrix.toml").write_text(MATRIX)
        started = time.monotonic()
        suites = []
        for world_size in world_sizes:
            command = [
                sys.executable,
                "-m",
                "torchmatrix",
                "run",
                "--torch",
                "system",
                "--only",
                f"world_size={world_size}",
                "--run-id",
                f"ws{world_size}",
            ]
            subprocess.run(command, cwd=project, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL)
            suites += list(JUnitXml.fromfile(str(project / "reports" / f"ws{world_size}" / "junit.xml")))
        wall = time.monotonic() - started
        print(f"{tests} trivial tests per world size, one run per world size; all runs {wall:.1f} s\n")
        print(
            "| world size | tests | first test | median per test | p95 per test | mean after the first | target <= 0.1 s |"
        )
        print("|---|---|---|---|---|---|---|")
        worst = 0.0
        for suite in suites:
            times = [case.time for case in suite]
            failed = sum(1 for case in suite if not case.is_passed)
            rest = times[1:]
            mean = statistics.fmean(rest)
            p95 = sorted(rest)[int(0.95 * (len(rest) - 1))]
            worst = max(worst, mean)
            note = "" if not failed else f" ({failed} not passed)"
            print(
                f"| {suite.name.split('/')[1]} | {len(times)}{note} | {times[0]:.2f} s | {statistics.median(rest) * 1000:.1f} ms | {p95 * 1000:.1f} ms | {mean * 1000:.1f} ms | {'met' if mean <= TARGET_S else 'NOT met'} |"
            )
    print(
        f"\nworst mean overhead per test: {worst * 1000:.1f} ms (target <= {TARGET_S * 1000:.0f} ms: {'met' if worst <= TARGET_S else 'NOT met'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
