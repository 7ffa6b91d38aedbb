"""Proof on real torch: the default matrix with an older release as baseline and today's pin as candidate.

Runs `nox -R -s gpu_matrix` (building a venv only where none exists) on a scratch copy of
matrix.toml whose [torch] lists the given versions, every failure re-run alone, then prints what
docs/how-to/check-a-torch-upgrade.md shows: totals per version, each distinct root cause
with its count, and for every failing test of the baseline whether it fails alone.

    pip install -e . && python bench/upgrade_check.py [--baseline 2.7.1] [--candidate 2.13.0] [--deadline 60]

`--deadline` caps every suite's per-test deadline: a release that hangs (2.7.1 hangs in FSDP1's
optimizer state_dict on a resharded load) costs one deadline per hang and per confirmation, and
no test of the default matrix takes more than ~10 s here.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

sys.path.insert(0, str(REPO))

from tiny_project import write_tiny_project  # noqa: E402

from torchmatrix.reports.run_reader import load_results  # noqa: E402
from torchmatrix.reports.untrusted_text import one_line  # noqa: E402
from torchmatrix.reports.upgrade_diff import upgrade_diffs  # noqa: E402


def scratch_matrix(directory: Path, versions: list[str], deadline: int | None) -> Path:
    """matrix.toml with only its [torch] versions and baseline changed (and deadlines capped); its
    suites are the built-ins and its components torchmatrix.models, so it runs from any directory."""
    text = (REPO / "matrix.toml").read_text()
    listed = ", ".join(f'"{v}"' for v in versions)
    text = re.sub(r"(?m)^versions = \[.*?\]", f"versions = [{listed}]", text, count=1)
    text = re.sub(r'(?m)^baseline = ".*?"', f'baseline = "{versions[0]}"', text, count=1)
    if deadline:
        text = re.sub(r"(?m)^timeout = (\d+)", lambda m: f"timeout = {min(int(m.group(1)), deadline)}", text)
    path = directory / "matrix.toml"
    path.write_text(text)
    return path


def run(matrix: Path, run_id: str) -> float:
    env = {**os.environ, "TORCHMATRIX_CONFIG": str(matrix), "TORCHMATRIX_RUN_ID": run_id}
    started = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "nox",
            "-f",
            str(REPO / "noxfile.py"),
            "-R",
            "-s",
            "gpu_matrix",
            "--",
            "--confirm-limit",
            "1000",
        ],
        env=env,
        check=False,
    )
    elapsed = time.monotonic() - started
    subprocess.run([sys.executable, "-m", "torchmatrix", "report", str(matrix.parent / "reports" / run_id)], check=True)
    return elapsed


def run_here(matrix: Path, run_id: str) -> float:
    """`run` without nox: the torch installed here, one `torchmatrix run`, then its report."""
    started = time.monotonic()
    command = [sys.executable, "-m", "torchmatrix", "run", "--torch", "system", "--config", str(matrix)]
    subprocess.run([*command, "--run-id", run_id, "--confirm-limit", "1000"], check=False)
    elapsed = time.monotonic() - started
    subprocess.run([sys.executable, "-m", "torchmatrix", "report", str(matrix.parent / "reports" / run_id)], check=True)
    return elapsed


def print_tables(run_dir: Path, elapsed: float) -> None:
    results = load_results(run_dir)
    print(f"\nrun {results.run_id}: {elapsed:.0f} s, {results.versions[0].environment.description}\n")
    print("| torch | build | cells | passed | failed | errors | skipped | re-run alone: fail alone | passed alone |")
    print("|---|---|---|---|---|---|---|---|---|")
    for version in results.versions:
        totals = results.totals(version.torch)
        failing = [r for r, _ in results.failures() if r.torch == version.torch]
        alone = [r.confirmation for r in failing]
        print(
            f"| {version.torch} | {version.environment.torch} | {len(version.planned_cells)} | {totals['passed']} | "
            f"{totals['failed']} | {totals['error']} | {totals['skipped']} | {alone.count('fails alone')} | "
            f"{alone.count('passed alone')} |"
        )
    print("\n| root cause | testcases | cells | torch | fail alone / re-run |")
    print("|---|---|---|---|---|")
    for cause in results.root_causes():
        confirmed = sum(1 for record, _ in cause.failures if record.confirmation == "fails alone")
        line = one_line(cause.line, 160).replace("|", "\\|")
        print(
            f"| `{line}` | {cause.tests} | {len(cause.cells)} | {', '.join(cause.versions)} | "
            f"{confirmed} / {len(cause.failures)} |"
        )
    failures = results.failures()
    for version in dict.fromkeys(record.torch for record, _ in failures):
        print(f"\nEvery failing test of torch {version}, each once per cell that ran it:\n")
        print("| suite | test | cell | status | alone | root cause |")
        print("|---|---|---|---|---|---|")
        for record, cells in (pair for pair in failures if pair[0].torch == version):
            more = f" +{len(cells) - 1}" if len(cells) > 1 else ""
            line = one_line(record.message, 120).replace("|", "\\|")
            print(
                f"| {record.suite} | `{record.test}` | {record.run_cell}{more} | {record.status} | "
                f"{record.confirmation or 'not re-run'} | `{line}` |"
            )
    for diff in upgrade_diffs(results):
        print(
            f"\nupgrade diff {diff.before} -> {diff.after}: {len(diff.regressions)} regressions, {len(diff.fixes)} fixes, "
            f"{len(diff.unconfirmed)} unconfirmed, {len(diff.newly_skipped)} newly skipped, {len(diff.drift)} drift "
            f"figures grown, {len(diff.slowdowns)} suites slower ({diff.compared} tests compared)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="2.7.1")
    parser.add_argument("--candidate", action="append", default=None, help="repeatable (default 2.13.0)")
    parser.add_argument("--deadline", type=int, default=None, help="cap every suite's per-test deadline (seconds)")
    parser.add_argument("--keep", type=Path, default=None, help="copy the run directory here")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="a throwaway one-suite matrix on the torch installed here, without nox (what CI runs: the tables, not the venvs)",
    )
    args = parser.parse_args()
    versions = ["system"] if args.tiny else [args.baseline, *(args.candidate or ["2.13.0"])]
    with tempfile.TemporaryDirectory(prefix="torchmatrix-upgrade-") as tmp:
        if args.tiny:
            matrix = write_tiny_project(Path(tmp), world_sizes=(1,))
        else:
            matrix = scratch_matrix(Path(tmp), versions, args.deadline)
        run_id = f"upgrade-{'-'.join(versions)}"
        elapsed = run_here(matrix, run_id) if args.tiny else run(matrix, run_id)
        run_dir = matrix.parent / "reports" / run_id
        print_tables(run_dir, elapsed)
        if args.keep:
            shutil.copytree(run_dir, args.keep / run_id, dirs_exist_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
