"""The grant: what the scheduler gives a waiting group's process when its turn comes.

The runner writes it to the group's gate file; the plugin in the pytest process waits for that
file and builds its ranks from what it reads. One definition serves both ends, so a renamed
field fails here, loudly, instead of as a missing key in another process.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.json_records import JsonRecord

GATE_POLL_S = 0.05


@dataclass(frozen=True)
class Grant(JsonRecord):
    """GPUs (none on CPU), the cores the group's ranks are pinned to (none: unpinned), the
    threads each rank may use, and the niceness its processes run at."""

    gpus: tuple[int, ...] = ()
    cores: tuple[int, ...] = ()
    threads_per_rank: int = 1
    nice: int = 0

    @classmethod
    def for_group(cls, world_size: int, slots: int, *, gpus=(), cores=(), nice: int = 0) -> Grant:
        """A grant of `slots` cores' (or GPUs') worth of room to a group of `world_size` ranks."""
        return cls(tuple(gpus), tuple(cores), max(1, slots // world_size), nice)

    def write(self, gate: Path) -> None:
        """Open the gate: write the grant atomically, so the waiting process never reads half of it."""
        file_writes.write_text(gate, json.dumps(self.to_json()))

    @classmethod
    def wait(cls, gate: Path) -> Grant:
        """Block until the runner opens `gate`, then return what it granted."""
        while not gate.exists():
            time.sleep(GATE_POLL_S)
        return cls.from_json(json.loads(gate.read_text()))
