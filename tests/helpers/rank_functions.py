"""Functions the pool tests run on rank processes (module-level, so ranks import them by name)."""

import os
import signal
import sys
import time


def identity():
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size(), os.getpid()


def raise_on_rank(bad_rank):
    import torch.distributed as dist

    if dist.get_rank() == bad_rank:
        raise ValueError(f"injected failure on rank {bad_rank}")
    return "fine"


def raise_on_rank_while_others_wait_in_all_reduce(bad_rank):
    import torch
    import torch.distributed as dist

    if dist.get_rank() == bad_rank:
        raise ValueError("injected failure before the all_reduce")
    dist.all_reduce(torch.ones(1))
    return "unreachable"


def raise_chained_on_rank(bad_rank):
    import torch.distributed as dist

    if dist.get_rank() == bad_rank:
        try:
            {}["the innermost cause"]
        except KeyError as cause:
            raise RuntimeError("the wrapper") from cause
    return "fine"


def mismatched_collectives():
    import torch.distributed as dist

    if dist.get_rank() == 0:
        dist.barrier()
    else:
        dist.all_gather_object([None, None], "rank 1")


def all_reduce_rank():
    import torch
    import torch.distributed as dist

    value = torch.ones(1)
    dist.all_reduce(value)
    return int(value.item()) - 1, dist.get_rank(), os.getpid()


def process_group_timeout():
    """The default process group's collective timeout on this rank, in seconds."""
    import torch
    import torch.distributed as dist

    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    return backend.options._timeout.total_seconds()


def spin_forever():
    while True:
        time.sleep(0.05)


def hang_in_barrier_except(rank_that_skips):
    import torch.distributed as dist

    if dist.get_rank() != rank_that_skips:
        dist.barrier()
    return "done"


def kill_self_on_rank(bad_rank, signum):
    import torch.distributed as dist

    if dist.get_rank() == bad_rank:
        if signum == signal.SIGSEGV:
            import ctypes

            ctypes.string_at(0)
        os.kill(os.getpid(), signum)
    return "survivor"


def print_then_kill_self_on_rank(bad_rank, megabytes):
    """Rank `bad_rank` prints `megabytes` of output, then a last line, then SIGKILLs itself."""
    import torch.distributed as dist

    if dist.get_rank() == bad_rank:
        chunk = b"x" * 1023 + b"\n"
        for _ in range(megabytes * 1024):
            os.write(1, chunk)
        os.write(1, b"THE LAST LINE\n")
        os.kill(os.getpid(), signal.SIGKILL)
    return "survivor"


def unpicklable_result():
    return lambda: None


def process_placement():
    """What the pool set up for this rank before any test code ran: who forked it, whether torch's
    distributed stack was already imported, its scheduling policy, cores, threads and niceness."""
    import torch

    return {
        "parent": os.getppid(),
        "fsdp_preloaded": "torch.distributed.fsdp" in sys.modules,
        "policy": os.sched_getscheduler(0),
        "cores": sorted(os.sched_getaffinity(0)),
        "threads": torch.get_num_threads(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "session_leader": os.getsid(0) == os.getpid(),
    }


def inherited_state(caller_file: str) -> dict:
    """What a rank carries over from the process that started its zygote: torch's distributed stack
    (wanted), its SIGTERM handler and the file `caller_file` it holds open (not wanted)."""
    open_files = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            open_files.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return {
        "fsdp_preloaded": "torch.distributed.fsdp" in sys.modules,
        "sigterm": "default" if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL else "changed",
        "caller_file_open": caller_file in open_files,
    }
