"""Wall time of the matrix two ways, side by side in one invocation, and their ratio.

(a) the naive baseline many projects use: sequentially, per cell,
    `torchrun --standalone --nproc-per-node=N -m pytest <every suite>` with that one cell planned
    (each launch imports torch on every rank and creates its own process group);
(b) `python -m torchmatrix run --torch system`.

Both run the same cells of the matrix in this environment, first cold (empty compile caches), then
warm: again, each way with the caches its cold pass left (torchmatrix's compile store; the naive
launches' per-cell cache folders, which persist as torch's default cache directory would). Usage:

    python bench/matrix_walltime.py [--config matrix.toml] [--only AXIS=V] [-k EXPR] [--cold-only]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from junitparser import JUnitXml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiny_project import write_tiny_project  # noqa: E402

from torchmatrix.env.devices import probe  # noqa: E402
from torchmatrix.forks.leftover_processes import adopt_orphans, reap_children  # noqa: E402
from torchmatrix.matrix.config import load_matrix  # noqa: E402
from torchmatrix.matrix.plan import Group, plan_runs  # noqa: E402
from torchmatrix.matrix.selection import parse_only, select_cells  # noqa: E402
from torchmatrix.messages.events import EventReader, TestFinished  # noqa: E402
from torchmatrix.ranks.per_test_usage import cpu_seconds_once  # noqa: E402
from torchmatrix.run.pytest_command import events_path, group_command  # noqa: E402
from torchmatrix.status import Status  # noqa: E402


def naive(matrix, cells, environment, work: Path) -> dict:
    """One torchrun launch per cell, one after another, every suite in every cell."""
    tests = failed = 0
    started = time.monotonic()
    for index, cell in enumerate(cells, 1):
        launcher = (
            f"{sys.executable} -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node={cell.world_size}"
        )
        group = Group(f"cell-{cell.id}", cell.world_size, tuple(plan_runs([cell], matrix.suites)), launcher=launcher)
        command = group_command(matrix, "system", group, environment, work)
        env = {**os.environ, "TORCHMATRIX_DEVICE": environment.device_type, "OMP_NUM_THREADS": "1"}
        cell_started = time.monotonic()
        with open(work / f"{group.name}.log", "wb") as log:
            subprocess.run(command, cwd=matrix.root, env=env, stdout=log, stderr=subprocess.STDOUT)
        results = [e for e in EventReader(events_path(work, group)).read_new() if isinstance(e, TestFinished)]
        tests += len(results)
        failed += sum(Status.parse(e.status, "test event status").is_failing for e in results)
        print(
            f"  naive [{index}/{len(cells)}] {cell.id}: {len(results)} tests in {time.monotonic() - cell_started:.1f}s",
            flush=True,
        )
    return {
        "seconds": time.monotonic() - started,
        "cells": len(cells),
        "tests": tests,
        "failed": failed,
        "process_groups": len(cells),
    }


def torchmatrix_run(matrix, selection_args: list[str], work: Path, store: Path | None = None) -> dict:
    """`torchmatrix run` of the selected cells with the compile store `store`, or cold (None), timed."""
    started, children_before = time.monotonic(), children_cpu_seconds()
    command = [
        sys.executable,
        "-m",
        "torchmatrix",
        "run",
        "--torch",
        "system",
        "--config",
        str(matrix.path),
        "--reports",
        str(work),
        "--run-id",
        "bench",
        *(["--compile-cache", str(store)] if store else ["--cold-compile"]),
        *selection_args,
    ]
    subprocess.run(command, cwd=matrix.root, stdout=subprocess.DEVNULL)
    seconds, process_cpu_seconds = time.monotonic() - started, children_cpu_seconds() - children_before
    run_dir = work / "bench"
    plan = json.loads((run_dir / "torch-system" / "plan.json").read_text())
    suites = list(JUnitXml.fromfile(str(run_dir / "junit.xml")))
    events = [
        e for path in (run_dir / "torch-system" / "logs").glob("*.events.jsonl") for e in EventReader(path).read_new()
    ]
    ran = {(e.cell, e.suite, e.test) for e in events if isinstance(e, TestFinished)}
    return {
        "seconds": seconds,
        "cells": len(suites),
        "tests": len(ran),
        "testcases_reported": sum(s.tests for s in suites),
        "failed": sum(s.failures + s.errors for s in suites),
        "process_groups": plan["pool_starts"],
        "cpu_seconds": cpu_seconds_once(events),
        "process_cpu_seconds": process_cpu_seconds,
    }


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's finished children and what they waited for, the
    adopted orphans (the rank processes, children of a forkserver nobody waits for) reaped first."""
    reap_children(wait=False)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="matrix.toml")
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("-k", dest="keyword")
    parser.add_argument("--tiny", action="store_true", help="a throwaway one-suite matrix of one cell (what CI runs)")
    parser.add_argument("--cold-only", action="store_true", help="measure the cold pass only")
    args = parser.parse_args()
    adopt_orphans()
    with tempfile.TemporaryDirectory(prefix="torchmatrix-tiny-") as tiny:
        config = write_tiny_project(Path(tiny), world_sizes=(1,)) if args.tiny else args.config
        return measure(load_matrix(config), args)


def measure(matrix, args) -> int:
    cells = select_cells(matrix.cells(), only=parse_only(args.only, matrix.axes), keyword=args.keyword)
    found = probe()
    environment = found.running(sys.executable)
    selection_args = [f"--only={o}" for o in args.only] + (["-k", args.keyword] if args.keyword else [])
    print(f"torch {found.torch} on {found.description}; {len(cells)} cells, suites: {', '.join(matrix.suites)}")
    with tempfile.TemporaryDirectory(prefix="torchmatrix-bench-") as tmp:
        for temperature in ("cold", "warm")[: 1 if args.cold_only else 2]:
            print(f"{temperature}: (b) python -m torchmatrix run ...", flush=True)
            ours = torchmatrix_run(matrix, selection_args, Path(tmp) / "ours" / temperature, Path(tmp) / "store")
            print(f"{temperature}: (a) naive: torchrun -m pytest per cell, sequentially ...", flush=True)
            naive_work = Path(tmp) / "naive" / temperature  # its cells' compile caches: naive/compile-cache
            naive_work.mkdir(parents=True)
            baseline = naive(matrix, cells, environment, naive_work)
            report(temperature, ours, baseline)
    return 0


def report(temperature: str, ours: dict, baseline: dict) -> None:
    """One pass's table, torchmatrix's distance from its CPU floor, and the ratio against its target."""
    print(f"\n{temperature} (compile caches {'empty' if temperature == 'cold' else 'as the cold pass left them'}):\n")
    print("| way | wall time | cells | tests executed | process groups created | failed |")
    print("|---|---|---|---|---|---|")
    print(
        f"| naive torchrun per cell | {baseline['seconds']:.1f} s | {baseline['cells']} | {baseline['tests']} | {baseline['process_groups']} | {baseline['failed']} |"
    )
    print(
        f"| torchmatrix run | {ours['seconds']:.1f} s | {ours['cells']} | {ours['tests']} ({ours['testcases_reported']} testcases reported) | {ours['process_groups']} | {ours['failed']} |"
    )
    ratio = baseline["seconds"] / ours["seconds"]
    cores = len(os.sched_getaffinity(0))
    floor = ours["process_cpu_seconds"] / cores
    print(
        f"\nfloor: torchmatrix run used {ours['process_cpu_seconds']:.1f} CPU seconds (every process it started, "
        f"rank processes included, getrusage), {ours['cpu_seconds']:.1f} of them in the tests (ranks + pytest, each "
        f"execution once), so on "
        f"{cores} cores no run finishes in under {floor:.1f} s; torchmatrix took {ours['seconds']:.1f} s, "
        f"{ours['seconds'] - floor:.1f} s above the floor ({ours['seconds'] / floor if floor else float('inf'):.2f}x)"
    )
    target = 3 if temperature == "cold" else 5
    print(
        f"\n{temperature}: ratio naive / torchmatrix = {ratio:.2f} (target >= {target}: {'met' if ratio >= target else 'NOT met'})"
    )


if __name__ == "__main__":
    sys.exit(main())
