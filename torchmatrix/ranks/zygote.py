"""The zygote rank processes are forked from: one interpreter per pytest process that has imported
torch's distributed stack once, so a rank starts in milliseconds instead of importing torch again
(seconds of CPU per rank, paid by every rank of a cell at once on the same cores).

It is multiprocessing's forkserver with torch preloaded. It never initializes CUDA or OpenMP
threads, so the ranks forked from it can.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing import forkserver

PRELOAD = [
    "torchmatrix.ranks.zygote_guard",
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
    """Start the zygote now, so its imports overlap pytest's collection instead of the first pool start."""
    context()
    forkserver.ensure_running()
