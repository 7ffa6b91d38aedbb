"""What a change to a matrix costs: `torchmatrix run --torch system` on two matrix files, one after
the other in one invocation, and the ratio of their wall times.

The default matrix must stay within 1.5x of its previous wall time when it gains axes, so a
change to it is measured against the file it replaces, on the same machine, minutes apart:

    git show <rev>:matrix.toml > before.toml
    python bench/matrix_growth.py --before before.toml --after matrix.toml
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from matrix_walltime import torchmatrix_run  # noqa: E402
from tiny_project import write_tiny_project  # noqa: E402

from torchmatrix.matrix.config import load_matrix  # noqa: E402

BUDGET = 1.5
"""How much longer the default matrix may take after it grows (issue 38)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="the matrix file as it was")
    parser.add_argument("--after", default="matrix.toml", help="the matrix file as it is (default: ./matrix.toml)")
    parser.add_argument("--tiny", action="store_true", help="two throwaway one-cell matrices (what CI runs)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="torchmatrix-growth-") as tmp:
        work = Path(tmp)
        if args.tiny:
            before = write_tiny_project(work / "before", world_sizes=(1,))
            after = write_tiny_project(work / "after", world_sizes=(1,))
        elif args.before is None:
            parser.error("--before FILE is required (the matrix file as it was), unless --tiny")
        else:
            before, after = Path(args.before).resolve(), Path(args.after).resolve()
        rows = []
        for name, config in (("before", before), ("after", after)):
            print(f"{name}: python -m torchmatrix run --torch system --config {config} ...", flush=True)
            rows.append((name, config, torchmatrix_run(load_matrix(config), [], work / name / "reports")))
    print()
    print("| matrix | wall time | cells | tests executed | testcases reported | failed |")
    print("|---|---|---|---|---|---|")
    for name, config, result in rows:
        print(
            f"| {name} ({Path(config).name}) | {result['seconds']:.1f} s | {result['cells']} | {result['tests']} | "
            f"{result['testcases_reported']} | {result['failed']} |"
        )
    ratio = rows[1][2]["seconds"] / rows[0][2]["seconds"]
    print(f"\nratio after / before = {ratio:.2f} (budget <= {BUDGET}: {'met' if ratio <= BUDGET else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
