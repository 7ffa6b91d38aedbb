"""Does the slowdown rule flag the machine or torch? One torch, three runs of a small compute-bound matrix:

  A  the reference run, on whatever load the machine has;
  B  the same, with CPU hogs (busy processes, 4 per core by default) running the whole time;
  C  the same with an injected 2x compute cost in the `work` suite's tests (its `repeat` option), no hogs.

The upgrade diff's own rule compares B and C against A. Honest: B flags no suite (wall time grew, CPU
time did not), C flags `work` and only it. Prints, per comparison, each suite's wall and CPU ratios,
the load average each run recorded in plan.json, and the suites flagged.

    pip install -e . && python bench/slowdown_under_load.py [--tiny | --smoke] [--hogs N]

--tiny runs fewer, shorter tests; it checks the wiring and the verdicts, not figures worth quoting.
--smoke runs one short test per suite at world size 1 (what CI runs, through tests/run/test_slowdown_bench.py):
it proves the bench runs both comparisons and judges; below the rule's floors, its verdict means nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

sys.path.insert(0, str(REPO))

from torchmatrix.messages.properties import CPU_SECONDS  # noqa: E402
from torchmatrix.reports.report import load_run  # noqa: E402
from torchmatrix.reports.upgrade_diff import compare_runs  # noqa: E402

SUITE = '''
import torch
import torch.distributed as dist


def burn(iterations, size):
    """Matrix products, then an all_reduce per iteration, as a training step's compute and gradient sync."""
    torch.manual_seed(0)
    a = torch.randn(size, size)
    for _ in range(iterations):
        a = torch.tanh(a @ a)
        dist.all_reduce(a)
        a /= dist.get_world_size()
    return float(a.sum())


def test_step(cell, ranks, suite_options, index):
    options = suite_options
    ranks.run(burn, options["iterations"] * options.get("repeat", 1), options["size"])
'''

SIZES = {  # each test uses ~1.5 s of CPU (tiny) or more, over the rule's 0.5 s floor; a 2x cost adds over its 5 s
    "full": {"tests": 6, "iterations": 800, "size": 384, "world_sizes": [1, 2]},
    "tiny": {"tests": 4, "iterations": 500, "size": 320, "world_sizes": [2]},
    "smoke": {"tests": 1, "iterations": 10, "size": 64, "world_sizes": [1]},  # wiring only: no test crosses a floor
}


def write_project(root: Path, scale: dict, work_repeat: int) -> Path:
    """A project with two identical compute-bound suites, `work` (with `repeat`) and `steady`."""
    (root / "suites").mkdir(parents=True, exist_ok=True)
    indices = f"\nimport pytest\n\n\n@pytest.fixture(params=range({scale['tests']}))\ndef index(request):\n    return request.param\n"
    for name in ("work", "steady"):
        (root / "suites" / f"test_{name}.py").write_text(SUITE + indices)
    options = f"iterations = {scale['iterations']}\nsize = {scale['size']}\n"
    (root / "matrix.toml").write_text(
        f'[torch]\nversions = ["system"]\n\n[axes]\nworld_size = {scale["world_sizes"]}\n\n'
        f'[suites.work]\npath = "suites/test_work.py"\ntimeout = 600\n\n[suites.work.options]\n{options}repeat = {work_repeat}\n\n'
        f'[suites.steady]\npath = "suites/test_steady.py"\ntimeout = 600\n\n[suites.steady.options]\n{options}'
    )
    return root / "matrix.toml"


def run_matrix(root: Path, reports: Path, run_id: str, scale: dict, work_repeat: int) -> Path:
    matrix = write_project(root / run_id, scale, work_repeat)
    command = [sys.executable, "-m", "torchmatrix", "run", "--torch", "system", "--config", str(matrix)]
    command += ["--reports", str(reports), "--run-id", run_id, "--confirm-limit", "0"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(
        [sys.executable, "-m", "torchmatrix", "report", str(reports / run_id)], check=True, stdout=subprocess.DEVNULL
    )
    return reports / run_id


def start_hogs(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def ratios(reference: Path, other: Path) -> dict[str, tuple[float, float]]:
    """Per suite: (wall ratio, CPU ratio) of totals over the tests that passed on both sides."""
    old, new = load_run(reference), load_run(other)
    before = {(r.suite, r.test, r.cell): r for r in old.tests}
    sums: dict[str, list[float]] = {}
    for record in new.tests:
        base = before.get((record.suite, record.test, record.cell))
        if base is None or base.status.value != "passed" or record.status.value != "passed":
            continue
        totals = sums.setdefault(record.suite, [0.0, 0.0, 0.0, 0.0])
        totals[0] += base.duration
        totals[1] += record.duration
        totals[2] += base.figures.get(CPU_SECONDS, 0.0)
        totals[3] += record.figures.get(CPU_SECONDS, 0.0)
    return {suite: (t[1] / t[0], t[3] / t[2] if t[2] else float("nan")) for suite, t in sums.items()}


def load_of(run_dir: Path) -> float:
    plan = json.loads((run_dir / "torch-system" / "plan.json").read_text())
    return plan["load_average"].get("mean", float("nan"))


def compare(label: str, reference: Path, other: Path) -> list[str]:
    """Print the comparison the way the upgrade diff sees it; return the suites it flags."""
    [diff] = compare_runs(load_run(reference), load_run(other))
    flagged = sorted(s.suite for s in diff.slowdowns)
    print(f"\n{label}: load average {load_of(reference):.1f} (A) vs {load_of(other):.1f}")
    for suite, (wall, cpu) in sorted(ratios(reference, other).items()):
        print(f"  {suite:8} wall {wall:.2f}x   CPU {cpu:.2f}x")
    print(f"  flagged: {', '.join(flagged) if flagged else 'none'}")
    return flagged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--tiny", action="store_true", help="fewer, shorter tests: checks the verdicts quickly")
    sizes.add_argument(
        "--smoke", action="store_true", help="one short test per suite: runs end to end, judges noise (CI)"
    )
    parser.add_argument("--hogs", type=int, default=4 * (os.cpu_count() or 1), help="busy processes during run B")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    args = parser.parse_args(argv)
    scale = SIZES["smoke" if args.smoke else "tiny" if args.tiny else "full"]
    with tempfile.TemporaryDirectory(prefix="torchmatrix-slowdown-") as tmp:
        root = args.keep or Path(tmp)
        reports = root / "reports"
        a = run_matrix(root, reports, "A-reference", scale, 1)
        hogs = start_hogs(args.hogs)
        try:
            b = run_matrix(root, reports, "B-hogs", scale, 1)
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
        c = run_matrix(root, reports, "C-work-2x", scale, 2)
        under_load = compare(f"B ({args.hogs} CPU hogs) against A", a, b)
        costlier = compare("C (work suite 2x compute) against A", a, c)
    honest = not under_load and costlier == ["work"]
    print(
        f"\nverdict: {'honest' if honest else 'NOT honest'}: {len(under_load)} suites flagged under load, {costlier or 'none'} flagged at 2x compute"
    )
    return 0 if honest else 1


if __name__ == "__main__":
    raise SystemExit(main())
