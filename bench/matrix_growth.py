"""What a change to a matrix costs: `torchmatrix run --torch system` on two matrix files, one after
the other in one invocation, and the ratios of their CPU seconds and of their wall times.

The default matrix must stay within 1.5x of its previous cost when it gains axes, so a change to it
is measured against the file it replaces, on the same machine, minutes apart. CPU seconds come
first: they hold on a machine other work shares, where wall time stretches with the load. They are
the tests' (what results.json records per test: every rank, each execution once) plus the runner's
(the run's processes the OS credits to this one: the runner and its pytest processes, which prepare
the compiler once for their ranks; not the ranks, which the zygote forks). `--apart EXPR` names
cells the budget leaves out, such as an include cell that alone costs more than the budget allows:
the matrix after then runs again without them, and both runs get their ratios. `--rounds N` runs
them all N times in turn and takes the ratios of the sums: the machine's speed drifts by a fifth
over minutes. Then, for the whole matrix after (its first round), where its CPU seconds went: each
cell's, split by suite, with the seconds its ranks spent in torch.compile (recorded apart,
ranks/compile_time.py), costliest first. Every run compiles cold (`--cold-compile`): a warm compile
store would make each round after the first cheaper than the first, and the ratio a measure of it:

    git show <rev>:matrix.toml > before.toml
    python bench/matrix_growth.py --before before.toml --after matrix.toml --apart inductor --rounds 2 --keep runs/
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from matrix_walltime import torchmatrix_run  # noqa: E402
from tiny_project import write_tiny_project  # noqa: E402

from torchmatrix.matrix.config import load_matrix  # noqa: E402
from torchmatrix.messages.events import EventReader, TestFinished  # noqa: E402
from torchmatrix.messages.properties import COMPILE_SECONDS, CPU_SECONDS  # noqa: E402

BUDGET = 1.5
"""How much longer the default matrix may take after it grows (issue 38)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="the matrix file as it was")
    parser.add_argument("--after", default="matrix.toml", help="the matrix file as it is (default: ./matrix.toml)")
    parser.add_argument(
        "--apart",
        metavar="EXPR",
        help="cells of the matrix after that the budget leaves out (a -k expression on cell ids): the matrix "
        "after runs a second time without them, and that run is measured against the budget too",
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="throwaway matrices of one cell and two, the second apart, two rounds (what CI runs)",
    )
    parser.add_argument("--keep", metavar="DIR", help="run the matrices under DIR and keep their run directories")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="run the matrices N times in turn and hold their sums to the budget: this machine's speed drifts "
        "by a fifth over minutes, and alternating spreads the drift over both sides (default: 1)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="torchmatrix-growth-") as tmp:
        work = Path(args.keep).resolve() if args.keep else Path(tmp)
        if args.tiny:
            before = write_tiny_project(work / "before", world_sizes=(1,))
            after = write_tiny_project(work / "after", world_sizes=(1, 2))
            args.apart, args.rounds = args.apart or "ws2", max(args.rounds, 2)
        elif args.before is None:
            parser.error("--before FILE is required (the matrix file as it was), unless --tiny")
        else:
            before, after = Path(args.before).resolve(), Path(args.after).resolve()
        runs = [("before", before, []), ("after", after, [])]
        if args.apart:
            runs.append((f"after without `{args.apart}`", after, ["-k", f"not ({args.apart})"]))
        rows = []
        for round_ in range(1, args.rounds + 1):
            for index, (name, config, selection) in enumerate(runs):
                print(
                    f"{name}: python -m torchmatrix run --torch system --config {config} {' '.join(selection)}",
                    flush=True,
                )
                reports = work / f"round{round_}-run{index}" / "reports"
                rows.append((name, config, torchmatrix_run(load_matrix(config), selection, reports)))
        after_cells = cell_costs(work / "round1-run1" / "reports" / "bench")
    print()
    print(
        "| matrix | test CPU s | runner CPU s | CPU s in all | wall time | cells | tests executed | testcases reported | failed |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, config, result in rows:
        print(
            f"| {name} ({Path(config).name}) | {result['cpu_seconds']:.1f} | {result['process_cpu_seconds']:.1f} | "
            f"{all_cpu_seconds(result):.1f} | {result['seconds']:.1f} s | {result['cells']} | {result['tests']} | "
            f"{result['testcases_reported']} | {result['failed']} |"
        )
    rounds = f" over {args.rounds} rounds" if args.rounds > 1 else ""
    for name, _, _ in runs[1:]:
        print()
        for figure, measure in FIGURES.items():
            before_sum, after_sum = (sum(measure(r) for n, _, r in rows if n == side) for side in ("before", name))
            print(ratio_line(f"{name}: {figure}{rounds}", before_sum, after_sum))
    print()
    print("| cell (after) | test CPU s | compile s | test CPU s by suite |")
    print("|---|---|---|---|")
    print("\n".join(after_cells))
    return 0


def all_cpu_seconds(result: dict) -> float:
    """The tests' CPU seconds and the runner's: work the runner does once for its ranks (importing the
    compiler, probing the CPU) moves from the first to the second, and counts either way."""
    return result["cpu_seconds"] + result["process_cpu_seconds"]


FIGURES = {"CPU seconds in all": all_cpu_seconds, "wall time": lambda result: result["seconds"]}
"""The figures whose after / before ratio is held to the budget, the primary one first."""


def ratio_line(figure: str, before: float, after: float) -> str:
    """One figure's after / before ratio and whether it is within the budget."""
    if before <= 0:
        return f"{figure}: after {after:.1f}, before {before:.1f} (no ratio)"
    ratio = after / before
    return (
        f"{figure}: ratio after / before = {ratio:.2f} (budget <= {BUDGET}: {'met' if ratio <= BUDGET else 'NOT met'})"
    )


def cell_costs(run_dir: Path) -> list[str]:
    """Table rows, costliest cell first: each cell's test CPU seconds (every execution once), the seconds
    its ranks compiled (the slowest rank's, per test, summed) and its CPU seconds per suite."""
    cpu: dict[str, float] = defaultdict(float)
    compiling: dict[str, float] = defaultdict(float)
    by_suite: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for path in sorted(run_dir.glob("torch-*/logs/*.events.jsonl")):
        for event in EventReader(path).read_new():
            if not isinstance(event, TestFinished):
                continue
            figures = {name: float(value) for name, value in event.properties if name in (CPU_SECONDS, COMPILE_SECONDS)}
            cpu[event.cell] += figures.get(CPU_SECONDS, 0.0)
            compiling[event.cell] += figures.get(COMPILE_SECONDS, 0.0)
            by_suite[event.cell][event.suite] += figures.get(CPU_SECONDS, 0.0)
    rows = []
    for cell in sorted(cpu, key=lambda cell: -cpu[cell]):
        suites = sorted(by_suite[cell].items(), key=lambda item: -item[1])
        split = ", ".join(f"{suite} {seconds:.1f}" for suite, seconds in suites if seconds >= 0.05)
        rows.append(f"| `{cell}` | {cpu[cell]:.1f} | {compiling[cell]:.1f} | {split} |")
    return rows


if __name__ == "__main__":
    sys.exit(main())
