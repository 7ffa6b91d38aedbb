"""The zygote rank processes are forked from: one per pytest process, with torch's distributed stack
imported, so a rank starts in milliseconds instead of importing torch again (seconds of CPU per
rank, paid by every rank of a cell at once on the same cores).

It is multiprocessing's forkserver with torch preloaded, itself forked from the pytest process once
that has imported the preload (`start`). It never initializes CUDA or OpenMP threads, so the ranks
forked from it can.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import importlib
import multiprocessing
import os
import queue
import signal
import sys
import threading
import warnings
from multiprocessing import forkserver, resource_tracker, util

from torchmatrix.forks.fresh_fork import close_files_except, run_then_leave

GUARD = "torchmatrix.forks.zygote_guard"
PRELOAD = [
    GUARD,
    "torch",
    "torch.distributed",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "torch.utils.checkpoint",
    "torch._inductor",  # torch.use_deterministic_algorithms imports it on first use
    "torchmatrix.ranks.worker",
]


def context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context whose processes fork from the zygote."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def start() -> None:
    """Start the zygote now, as a fork of this process once it has imported the preload itself.

    The pytest process imports torch to collect the suites anyway, so a fresh forkserver would import
    it a second time. Forking is as safe as the forkserver's
    own forks of the ranks only before this process runs anything: so only here, at start, and only
    while it runs no other thread. A zygote that dies later is started fresh by multiprocessing."""
    context()
    import_preload()
    if not sys.platform.startswith("linux") or threading.active_count() > 1:
        forkserver.ensure_running()
        return
    resource_tracker.ensure_running()  # its own interpreter, as always: only the forkserver is forked
    spawn = util.spawnv_passfds
    util.spawnv_passfds = _forked_or(spawn)
    try:
        forkserver.ensure_running()
    finally:
        util.spawnv_passfds = spawn


def import_preload() -> None:
    """Import into this process what the zygote preloads, but the guard (it ties the zygote, not
    this process, to its parent); a module that does not import is left to fail where it is used."""
    for name in PRELOAD:
        if name != GUARD:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)


def _forked_or(spawn):
    """`util.spawnv_passfds(path, args, passfds)` for a `python -c COMMAND` as a fork of this process
    running COMMAND, with only `passfds` and the standard streams open; anything else as `spawn`.

    The fork happens in a thread that then waits for good: the zygote's stack (in every rank's
    crash dump and hang stacks) starts there rather than under pytest's, and the parent-death signal
    the guard sets fires when the thread that forked ends, which is when this process does."""

    def spawn_or_fork(path, args, passfds):
        if len(args) < 2 or args[-2] != "-c":
            return spawn(path, args, passfds)
        forked = queue.SimpleQueue()

        def fork_and_stay():
            try:
                with warnings.catch_warnings():  # Python 3.12+ warns of forking with threads: torch's, this one
                    warnings.simplefilter("ignore", DeprecationWarning)
                    pid = os.fork()
            except OSError as error:  # out of memory or processes: multiprocessing raises it as it would
                forked.put(error)
                return
            if pid == 0:
                util.spawnv_passfds = spawn
                forkserver._forkserver._lock = threading.Lock()  # the parent's ensure_running holds it
                _run_as_fresh_interpreter(args[-1], passfds)
            forked.put(pid)
            threading.Event().wait()

        threading.Thread(target=fork_and_stay, name="zygote-parent", daemon=True).start()
        pid = forked.get()
        if isinstance(pid, OSError):
            raise pid
        return pid

    return spawn_or_fork


def _run_as_fresh_interpreter(command: str, passfds) -> None:
    """In the fork: drop what this process holds that a fresh interpreter would not (open files,
    signal handlers, faulthandler), run `command`, and leave without running any of the parent's
    exit handlers."""
    run_then_leave(lambda: _exec_as_fresh_interpreter(command, passfds))


def _exec_as_fresh_interpreter(command: str, passfds) -> None:
    gc.freeze()  # the parent's objects are never finalized here, so no stale descriptor is closed twice
    faulthandler.disable()
    faulthandler.unregister(signal.SIGUSR1)  # the pytest process's stack dump (its ranks register their own)
    for signum in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            if callable(signal.getsignal(signum)):
                signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    close_files_except({0, 1, 2, *passfds})
    exec(compile(command, "<zygote>", "exec"), {"__name__": "__mp_main__"})
