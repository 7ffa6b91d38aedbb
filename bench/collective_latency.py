"""Latency of small gloo collectives when a cell's ranks share fewer CPU cores than it has ranks,
under the scheduling the pool gives CPU ranks and the two it replaced, side by side in one run.

Each world size gets one rank pool; inside it, every rank switches all its threads to one policy,
then times `--ops` all_reduce and all_gather calls of 16 floats (the size of FSDP's small
collectives here). The slowest rank's mean is what a test waits for.

    python bench/collective_latency.py [--ops 1000]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torchmatrix.ranks.pool import RankPool  # noqa: E402

POLICIES = {
    "SCHED_OTHER, unpinned (a plain process)": ("other", False),
    "SCHED_BATCH, unpinned": ("batch", False),
    "SCHED_BATCH, pinned round robin (the pool's CPU ranks)": ("batch", True),
}


def timed_collectives(policy: str, pinned: bool, cores: list[int], ops: int) -> tuple[float, float]:
    """Rank function: put every thread of this rank under `policy` (pinned or not), then return the
    mean seconds per all_reduce and per all_gather."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    placement = {cores[rank % len(cores)]} if pinned else set(cores)
    scheduler = os.SCHED_BATCH if policy == "batch" else os.SCHED_OTHER
    for thread in os.listdir("/proc/self/task"):
        os.sched_setscheduler(int(thread), scheduler, os.sched_param(0))
        os.sched_setaffinity(int(thread), placement)
    value = torch.ones(16)
    gathered = [torch.empty(16) for _ in range(dist.get_world_size())]
    dist.barrier()
    started = time.perf_counter()
    for _ in range(ops):
        dist.all_reduce(value)
    all_reduce = (time.perf_counter() - started) / ops
    dist.barrier()
    started = time.perf_counter()
    for _ in range(ops):
        dist.all_gather(gathered, value)
    return all_reduce, (time.perf_counter() - started) / ops


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=1000, help="collectives of each kind per measurement")
    parser.add_argument("--tiny", action="store_true", help="5 collectives, world size 2 only (what CI runs)")
    args = parser.parse_args()
    ops, world_sizes = (5, (2,)) if args.tiny else (args.ops, (2, 4))
    # The ranks import the rank function by module name; run as a script, this file is __main__.
    rank_function = importlib.import_module(Path(__file__).stem).timed_collectives
    cores = sorted(os.sched_getaffinity(0))
    print(f"{len(cores)} cores; {ops} collectives of 16 floats per measurement, slowest rank's mean\n")
    print("| world size | ranks' scheduling | all_reduce | all_gather | all_reduce speed-up vs a plain process |")
    print("|---|---|---|---|---|")
    for world_size in world_sizes:
        pool = RankPool(world_size, device_type="cpu", backend="gloo", collective_timeout_s=60, cores=cores)
        try:
            baseline = None
            for name, (policy, pinned) in POLICIES.items():
                results = pool.run(rank_function, (policy, pinned, cores, ops), deadline=time.monotonic() + 600)
                all_reduce = max(r[0] for r in results)
                all_gather = max(r[1] for r in results)
                baseline = baseline or all_reduce
                print(
                    f"| {world_size} | {name} | {all_reduce * 1000:.2f} ms | {all_gather * 1000:.2f} ms | {baseline / all_reduce:.1f}x |"
                )
        finally:
            pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
