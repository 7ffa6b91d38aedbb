"""The rank process: join the process group once, then run the functions the pool sends.

`RankPool` forks it from the zygote (torchmatrix.forks.zygote) and talks to it over one end of a
socket pair. Messages are pickled tuples; results go back as ("ok", value) or ("error",
(traceback text, root cause line)). SIGUSR1 writes every thread's Python stack to the rank's
stack file, which is how the pool shows where a hung rank is stuck.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import Connection

from torchmatrix import file_writes
from torchmatrix.forks.parent_death import exit_with_parent
from torchmatrix.messages import compile_store
from torchmatrix.messages.root_cause import root_cause
from torchmatrix.ranks import shared_builds
from torchmatrix.ranks.aot_eager_cache import keep_aot_eager_graphs
from torchmatrix.ranks.compile_time import reset_keeping_time
from torchmatrix.ranks.mesh_cache_keys import stable_mesh_keys
from torchmatrix.ranks.per_test_usage import RANK_WARNINGS

COLLECTIVE_TIMEOUT_VARIABLE = "TORCHMATRIX_COLLECTIVE_TIMEOUT_S"
COMPILE_CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


def current_device():
    """The torch.device this rank computes on: its own GPU on CUDA boxes, else the CPU."""
    import torch

    if os.environ.get("TORCHMATRIX_DEVICE") == "cuda":
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return torch.device("cpu")


def in_compile_cache(directory: str, fn, args: tuple, world: str = "", aot_eager_alone: bool = False):
    """fn(*args) with torch.compile's on-disk caches (Inductor's FX graph and AOTAutograd caches,
    Triton's under it) in this rank's own folder of the cell's `directory`, and what Inductor builds
    from source alone in the folders its ranks share (`shared_builds`); graph caches shared between
    cells or ranks were measured wrong (docs/explanation/compile.md).

    Inductor reads TORCHINDUCTOR_CACHE_DIR at every cache access, not once at import, so setting it
    here re-homes every later compile of this long-lived rank; torch.compiler.reset() then drops
    what the rank compiled for the previous cell, so not even in memory does one cell reuse another's.
    A cell that compiles with aot_eager alone (`aot_eager_alone`) keeps its graphs there too (`aot_eager_cache`).
    """
    rank_folder = compile_store.rank_folder(directory, os.environ.get("RANK", "0"), world)
    if os.environ.get(COMPILE_CACHE_VARIABLE) != rank_folder:
        os.environ[COMPILE_CACHE_VARIABLE] = rank_folder
        shared_builds.place(
            probe=compile_store.probe_folder(directory), kernels=compile_store.kernels_folder(directory)
        )
        if "torch" in sys.modules:
            reset_keeping_time()
            keep_aot_eager_graphs(aot_eager_alone)
    return fn(*args)


def current_cell_id() -> str | None:
    """The id of the cell whose test this rank runs now, or None before its first: `in_compile_cache`
    keeps the cell's compile cache in a folder named after it (`<cell id>/rank<N>`)."""
    directory = os.environ.get(COMPILE_CACHE_VARIABLE)
    return os.path.basename(os.path.dirname(directory)) if directory else None


def _join_process_group(conn: Connection, rank: int, world_size: int) -> None:
    """Rank 0 hosts the TCPStore on a port the OS picks, so parallel cells never collide.

    The process group's timeout (and the store's) is the pool's collective timeout, which is
    longer than any test's deadline: a hang ends with the deadline's stacks, not a gloo timeout.
    """
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = timedelta(seconds=float(os.environ[COLLECTIVE_TIMEOUT_VARIABLE]))
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
        conn.send_bytes(pickle.dumps(("port", store.port)))
    else:
        _, port = pickle.loads(conn.recv_bytes())
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout)
    device = current_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend=os.environ["TORCHMATRIX_BACKEND"],
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )
    dist.barrier()


def _serve(conn: Connection) -> None:
    while True:
        try:
            payload = conn.recv_bytes()
        except EOFError:
            return
        try:
            kind, fn, args = pickle.loads(payload)
            if kind == "exit":
                return
            reply = ("ok", fn(*args))
        except BaseException as error:
            reply = error_reply(error)
        try:
            data = pickle.dumps(reply)
        except Exception as error:
            data = pickle.dumps(error_reply(error, "the rank function returned a value that cannot be pickled:\n"))
        conn.send_bytes(data)


def error_reply(error: BaseException, preface: str = "") -> tuple[str, tuple[str, str]]:
    """The reply for the exception being handled: its traceback, and its root cause line for the report."""
    return ("error", (preface + traceback.format_exc(), root_cause(error)))


def main(
    conn: Connection,
    rank: int,
    world_size: int,
    *,
    stack_file: str,
    log: str,
    env: dict,
    nice: int,
    core: int | None,
) -> None:
    """Become the process a fresh interpreter started by the pool would be (own session, the pool's
    environment and niceness, output into the rank's log), join the process group, then serve.
    It dies with the zygote, which dies with its pytest process, so no rank outlives a killed run."""
    os.setsid()
    exit_with_parent()
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    if env["TORCHMATRIX_DEVICE"] == "cpu":
        share_cores(core)
    output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.clear()
    os.environ.update(env)
    stacks = file_writes.open_stream(stack_file, "a")
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    faulthandler.enable(file=sys.stderr)
    sys.path[:] = pickle.loads(conn.recv_bytes())
    RANK_WARNINGS.install()
    try:
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))  # torch read the variable at import, in the zygote
        shared_builds.share_inductor_builds(COMPILE_CACHE_VARIABLE)
        stable_mesh_keys()
        _join_process_group(conn, rank, world_size)
    except BaseException as error:
        conn.send_bytes(pickle.dumps(error_reply(error)))
        return
    conn.send_bytes(pickle.dumps(("ready", os.getpid())))
    _serve(conn)
    os._exit(0)


def share_cores(core: int | None) -> None:
    """Settings for ranks simulated on shared CPU cores, made before any thread starts so gloo's
    threads inherit them. SCHED_BATCH: a rank woken by a collective does not preempt the peer
    that is mid-send (a 4-rank all_reduce on 2 cores got 4x faster). Pinning, to the group's
    cores round robin, stops the ranks of one collective chasing each other across cores."""
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    if core is not None:
        os.sched_setaffinity(0, {core})
