"""Every bench in bench/ runs in its --tiny mode (seconds, a throwaway one-suite matrix), so a
bench that no longer runs fails CI instead of the next person who wants its figures."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers.checkout import REPO, checkout_env

pytestmark = pytest.mark.slow

# Each bench, and a line its output must end up with: the figure its docstring promises.
BENCHES = {
    "collective_latency": r"\| 2 \| SCHED_OTHER, unpinned \(a plain process\) \| [\d.]+ ms \| [\d.]+ ms \| 1\.0x \|",
    "compile_cache": r"\| aot_eager \| outside \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|",
    "env_overhead": r"\| `torchmatrix run --shard <empty shard>` on the torch here \| [\d.]+ s \|",
    "matrix_growth": r"\| after \(matrix\.toml\) \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ s \| 2 \| 2 \| 2 \| 0 \|\n"
    r"\| after without `ws2` \(matrix\.toml\) \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ s \| 1 \| 1 \| 1 \| 0 \|[\s\S]*"
    r"after without `ws2`: wall time over 2 rounds: ratio after / before = [\d.]+[\s\S]*\| `ws2` \| [\d.]+ \| [\d.]+ \|",
    "matrix_walltime": r"cold \(compile caches empty\)[\s\S]*\| torchmatrix run \| [\d.]+ s \| 1 \| 1 \(1 testcases reported\) \| \d+ \| 0 \|"
    r"[\s\S]*warm \(compile caches as the cold pass left them\)[\s\S]*\| torchmatrix run \| [\d.]+ s \| 1 \| 1 \(1 testcases reported\) \| \d+ \| 0 \|",
    "per_test_overhead": r"worst mean overhead per test: [\d.]+ ms",
    "plan_scale": r"\| OutcomeBook \+ cell_done for every cell \| [\d.]+ s \| [\d.]+ s \|",
    "timing_noise": r"largest total or median ratio between runs of one torch: [\d.]+",
    "upgrade_check": r"\| system \| [^|]+ \| 1 \| 1 \| 0 \| 0 \| 0 \| 0 \| 0 \|",
}


# Benches whose tiny run asserts a verdict of its own, in their own test.
OWN_TEST = {"slowdown_under_load": "tests/run/test_slowdown_bench.py"}


def test_every_bench_has_a_tiny_run():
    benches = [path.stem for path in (REPO / "bench").glob("*.py") if path.stem != "tiny_project"]
    assert sorted([*BENCHES, *OWN_TEST]) == sorted(benches)
    assert all((REPO / test).is_file() for test in OWN_TEST.values())


@pytest.mark.parametrize("bench", sorted(BENCHES))
def test_the_bench_runs_in_its_tiny_mode(bench, tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / f"{bench}.py"), "--tiny"],
        cwd=tmp_path,
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert re.search(BENCHES[bench], done.stdout), done.stdout[-3000:]
