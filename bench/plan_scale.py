"""Planning at scale: how long `torchmatrix list` takes on 10^5 cells, and planning, grouping and
booking them for a run (all of it must stay near-linear in the number of cells).

Writes a throwaway matrix of world_size x a x b x c = 4 x 25 x 40 x 25 = 100,000 cells with one
suite, then times, best of `--repeat`:

- `python -m torchmatrix list` end to end (a subprocess: imports, load, expansion, id check, print);
- in one process: load + expand, `plan_runs`, `group_runs` (8 slots) and `OutcomeBook` over every cell.

    python bench/plan_scale.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_LIST_S = 2.0
GROUP_CELLS = 8_000

sys.path.insert(0, str(REPO))

from torchmatrix.matrix.config import load_matrix  # noqa: E402
from torchmatrix.matrix.plan import group_runs, plan_runs  # noqa: E402
from torchmatrix.run.outcomes import OutcomeBook  # noqa: E402


def matrix_text(a: int = 25, b: int = 40, c: int = 25) -> str:
    letters = [f'"{p}{i}"' for p in "xyz" for i in range(10)][:c]
    return f"""
[torch]
versions = ["system"]

[axes]
world_size = [1, 2, 4, 8]
a = [{", ".join(str(i) for i in range(a))}]
b = [{", ".join(str(i) for i in range(b))}]
c = [{", ".join(letters)}]

[suites.s]
path = "suites/test_s.py"
"""


def book_every_cell(runs, cells) -> None:
    """What the runner does per poll: a book over every run, then which cells are done."""
    book = OutcomeBook(runs)
    for cell in cells:
        book.cell_done(cell)


def best(repeat: int, action) -> tuple[float, float]:
    """The fastest of `repeat` runs: (wall, CPU) seconds; CPU counts this process and its children,
    so a busy shared machine (wall) can be told from the work itself (CPU)."""
    times = []
    for _ in range(repeat):
        cpu = _cpu()
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started, _cpu() - cpu))
    return min(times)


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="1,000 cells, once (what CI runs)")
    args = parser.parse_args()
    repeat = 1 if args.tiny else args.repeat
    with tempfile.TemporaryDirectory(prefix="torchmatrix-plan-scale-") as tmp:
        root = Path(tmp)
        (root / "suites").mkdir()
        (root / "suites" / "test_s.py").write_text("def test_s(cell):\n    pass\n")
        (root / "matrix.toml").write_text(matrix_text(5, 10, 5) if args.tiny else matrix_text())
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}

        def list_cells() -> None:
            subprocess.run(
                [sys.executable, "-m", "torchmatrix", "list"],
                cwd=root,
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

        listed = best(repeat, list_cells)
        matrix = load_matrix(root / "matrix.toml")
        cells = matrix.cells()
        loaded = best(repeat, lambda: load_matrix(root / "matrix.toml").cells())
        runs = plan_runs(cells, matrix.suites)
        planned = best(repeat, lambda: plan_runs(cells, matrix.suites))
        grouped = best(repeat, lambda: group_runs(runs, 8))
        few = runs[:GROUP_CELLS]
        grouped_few = best(repeat, lambda: group_runs(few, 8))
        booked = best(repeat, lambda: book_every_cell(runs, cells))
    print(f"| step ({len(cells):,} cells, best of {repeat}) | wall | CPU |")
    print("|---|---|---|")
    verdict = "met" if listed[0] <= TARGET_LIST_S else "NOT met"
    print(
        f"| `python -m torchmatrix list` (subprocess; target wall <= {TARGET_LIST_S:.0f} s: {verdict}) | {_row(listed)} |"
    )
    print(f"| load matrix.toml + expand + check ids | {_row(loaded)} |")
    print(f"| plan_runs | {_row(planned)} |")
    print(f"| group_runs, 8 slots | {_row(grouped)} |")
    print(f"| group_runs, 8 slots, {GROUP_CELLS:,} cells | {_row(grouped_few)} |")
    print(f"| OutcomeBook + cell_done for every cell | {_row(booked)} |")
    return 0 if listed[0] <= TARGET_LIST_S else 1


def _row(timing: tuple[float, float]) -> str:
    return f"{timing[0]:.2f} s | {timing[1]:.2f} s"


if __name__ == "__main__":
    raise SystemExit(main())
