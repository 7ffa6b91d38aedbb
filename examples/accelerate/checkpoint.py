"""The `checkpointer` component in its bound form: `accelerator.save_state` into a folder per step
and `accelerator.load_state` of the latest, the step read back from the folder's name as accelerate's
examples resume; the state keeps what the Accelerator prepared (the model, sharded under FSDP2, the
optimizer, the scheduler, the dataloader's position) and every process's RNG states."""

from __future__ import annotations

from pathlib import Path

from parallel import ACCELERATORS


class Checkpointer:
    """`step_<N>` folders under `directory`, of what the model's Accelerator prepared."""

    def __init__(self, directory: str, *, model, optimizer, scheduler, loader):
        self.directory, self.accelerator = Path(directory), ACCELERATORS[model]

    def save(self, step: int) -> None:
        self.accelerator.save_state(str(self.directory / f"step_{step}"))

    def load(self) -> int:
        latest = max(self.directory.glob("step_*"), key=lambda folder: int(folder.name.removeprefix("step_")))
        self.accelerator.load_state(str(latest))
        return int(latest.name.removeprefix("step_"))
