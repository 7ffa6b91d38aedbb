"""How far test times move between two runs of the same torch: the noise the slowdown rule must stay above.

Runs the default matrix twice with the torch installed here (`torchmatrix run --torch system`),
then compares the runs both ways with the upgrade diff's own timing: per suite, the ratio of
totals and the median of per-test ratios over tests that passed on both sides and took at least
MIN_TIMED_SECONDS. A slowdown rule is honest when no suite of a same-torch comparison is flagged.

    pip install -e . && python bench/timing_noise.py [--runs 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parent.parent

sys.path.insert(0, str(REPO))

from tiny_project import write_tiny_project  # noqa: E402

from torchmatrix.matrix.config import load_matrix  # noqa: E402
from torchmatrix.reports.run_reader import load_results  # noqa: E402
from torchmatrix.reports.upgrade_diff import MIN_TIMED_SECONDS, diff_records  # noqa: E402
from torchmatrix.status import Status  # noqa: E402


def timing_ratios(before, after) -> dict[str, tuple[float, float, float, int]]:
    """Per suite: (ratio of totals, median per-test ratio, largest per-test ratio, tests timed)."""
    old = {(r.suite, r.test, r.run_cell): r for r in before if r.ran_in is None}
    pairs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for record in after:
        base = old.get((record.suite, record.test, record.run_cell))
        if record.ran_in is None and base and base.status is record.status is Status.PASSED:
            if base.duration >= MIN_TIMED_SECONDS:
                pairs[record.suite].append((base.duration, record.duration))
    return {
        suite: (
            sum(b for _, b in timed) / sum(a for a, _ in timed),
            median(b / a for a, b in timed),
            max(b / a for a, b in timed),
            len(timed),
        )
        for suite, timed in pairs.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2, help="runs of the same torch to compare pairwise")
    parser.add_argument("--tiny", action="store_true", help="a throwaway one-suite matrix instead (what CI runs)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="torchmatrix-noise-") as tmp:
        matrix = write_tiny_project(Path(tmp) / "tiny", world_sizes=(1,)) if args.tiny else REPO / "matrix.toml"
        settings = load_matrix(matrix).report
        runs = []
        for index in range(args.runs):
            run_id = f"noise-{index}"
            subprocess.run(
                [sys.executable, "-m", "torchmatrix", "run", "--torch", "system", "--config", str(matrix)]
                + ["--run-id", run_id, "--reports", tmp],
                cwd=REPO,
                check=False,
                stdout=subprocess.DEVNULL,
            )
            runs.append(load_results(Path(tmp) / run_id).tests)
    print(
        f"slowdown rule: ratio {settings.slowdown_ratio:g} of totals and of the median test (tests >= {MIN_TIMED_SECONDS} s)"
    )
    print("| runs | suite | tests timed | total ratio | median test ratio | largest test ratio | flagged |")
    print("|---|---|---|---|---|---|---|")
    worst = 1.0
    for a in range(len(runs)):
        for b in range(len(runs)):
            if a == b:
                continue
            flagged = {s.suite for s in diff_records(runs[a], runs[b], settings, str(a), str(b)).slowdowns}
            for suite, (total, typical, largest, count) in timing_ratios(runs[a], runs[b]).items():
                worst = max(worst, total, typical)
                print(
                    f"| {a} → {b} | {suite} | {count} | {total:.2f} | {typical:.2f} | {largest:.2f} | "
                    f"{'yes' if suite in flagged else 'no'} |"
                )
    print(f"\nlargest total or median ratio between runs of one torch: {worst:.2f} (rule: {settings.slowdown_ratio:g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
