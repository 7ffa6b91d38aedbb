"""Ranks started by an external launcher (torchrun under srun) for cells wider than one node.

There, every rank runs the whole pytest session itself; `run(fn)` calls fn on this rank and
gathers every rank's reply, so suites see the same contract as with the local rank pool. A
hang cannot be interrupted from inside one rank: the runner's backstop kills the whole launch.
"""

from __future__ import annotations

import os
import re
import tempfile
from datetime import timedelta
from pathlib import Path

from torchmatrix.ranks.pool import RankFailure
from torchmatrix.ranks.worker import current_device, error_reply


def launched_rank() -> int:
    return int(os.environ.get("RANK", "0"))


class LaunchedRank:
    """This process as one rank of a launcher-made world: same interface as RankPool."""

    def __init__(self, world_size: int, *, backend: str, collective_timeout_s: float):
        self.world_size = world_size
        self.backend = backend
        self.collective_timeout_s = collective_timeout_s
        self.starts = 0
        self.retired_cpu_seconds = 0.0  # the launcher's processes are counted where they run
        self.unread_ranks = 0

    @property
    def running(self) -> bool:
        import torch.distributed as dist

        return dist.is_initialized()

    def start(self) -> None:
        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            return
        launched = int(os.environ.get("WORLD_SIZE", "0"))
        if launched != self.world_size:
            raise RankFailure(
                f"the launcher started {launched} ranks for a world size {self.world_size} cell; check --gpus-per-node and the launcher's --nnodes/--nproc-per-node"
            )
        device = current_device()
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(self.backend, timeout=timedelta(seconds=self.collective_timeout_s))
        self.starts += 1

    def run(self, fn, args: tuple, *, deadline: float, name: str | None = None) -> list:
        """fn(*args) here, then every rank's reply gathered; any rank's exception fails every rank.

        The barrier first lets every rank finish its own copy of the test's main-process work
        (writing a dataset, say) before any rank reads it.
        """
        import torch.distributed as dist

        self.start()
        dist.barrier()
        try:
            reply = ("ok", fn(*args))
        except BaseException as error:
            reply = error_reply(error)
        replies: list = [None] * self.world_size
        dist.all_gather_object(replies, reply)
        errors = {rank: value for rank, (kind, value) in enumerate(replies) if kind == "error"}
        if errors:
            sections = [f"{getattr(fn, '__qualname__', fn)} raised on ranks {', '.join(map(str, errors))}"]
            sections += [f"---- rank {rank} traceback ----\n{text.rstrip()}" for rank, (text, _) in errors.items()]
            raise RankFailure("\n".join(sections), next(iter(errors.values()))[1])
        return [value for _, value in replies]

    def test_directory(self, own: Path, shared_root: Path, name: str) -> Path:
        """Every rank is its own pytest process, so they share a fresh directory that rank 0 makes
        under `shared_root` (on the shared filesystem) instead of each using `own`."""
        import torch.distributed as dist

        self.start()
        made = [None]
        if launched_rank() == 0:
            shared_root.mkdir(parents=True, exist_ok=True)
            made = [tempfile.mkdtemp(prefix=re.sub(r"[^\w.-]", "_", name)[:60] + "-", dir=shared_root)]
        dist.broadcast_object_list(made, src=0)
        return Path(made[0])

    def of_size(self, world_size: int) -> LaunchedRank:
        """Never: the launcher started this world's ranks, and no other world can be started from one of them."""
        raise RankFailure(
            f"ranks started by a launcher (torchrun, srun) cannot open a world of {world_size} of their own: "
            f"the launcher fixed the world at {self.world_size}"
        )

    def close(self, *, graceful: bool = True) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
