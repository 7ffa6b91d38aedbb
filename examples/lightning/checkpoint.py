"""The `checkpointer` component in its bound form: `fabric.save` and `fabric.load` of the whole
training state, as Fabric's docs write them (`state = {"model": ..., "optimizer": ..., "scheduler":
..., ...}`); sharded (DCP) under both FSDP strategies, one file on one device."""

from __future__ import annotations

from pathlib import Path

from parallel import FABRICS


class Checkpointer:
    """One checkpoint, `checkpoint` under `directory`, of the objects a Fabric loop holds."""

    def __init__(self, directory: str, *, model, optimizer, scheduler, loader):
        self.path = Path(directory) / "checkpoint"
        self.fabric = FABRICS[model]
        self.objects = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader}

    def save(self, step: int) -> None:
        self.fabric.save(self.path, {**self.objects, "step": step})

    def load(self) -> int:
        """The saved step; the objects are the ones the trainer holds, loaded in place by `fabric.load`."""
        state = {**self.objects, "step": 0}
        self.fabric.load(self.path, state)
        return state["step"]
