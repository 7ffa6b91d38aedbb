"""The `checkpointer` component in its bound form: torchtitan's own `CheckpointManager` (DCP, one
`step-N` folder per save), built once with the suites' model, optimizer, scheduler and loader as
its trainer builds it (the optimizer is its `OptimizersContainer`, optim.py), then `save(step)` and
`load()` (torchmatrix/components/protocol.py)."""

from __future__ import annotations

from torchtitan.components.checkpoint import CheckpointManager


class Checkpointer(CheckpointManager):
    """A `CheckpointManager` over `directory` whose train state (the step) it keeps itself, as
    torchtitan's trainer passes itself as `states={"train_state": ...}`."""

    def __init__(self, directory: str, *, model, optimizer, scheduler, loader):
        self.step = 0
        super().__init__(
            self.config(directory),
            dataloader=loader,
            model_parts=[model],
            optimizers=optimizer,
            lr_schedulers=scheduler,
            states={"train_state": self},
            sd_adapter=None,
        )

    def config(self, directory: str) -> CheckpointManager.Config:
        """Saving at every step (interval 1), keeping every save, with the full training state."""
        return CheckpointManager.Config(enable=True, folder=directory, interval=1, keep_latest_k=0)

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])

    def save(self, step: int) -> None:
        self.step = step
        super().save(step)

    def load(self) -> int:
        """Only for the protocol: the suites read the step `load` returns, the trainer its own train
        state (`CheckpointManager.load` returns only whether it loaded)."""
        super().load()
        return self.step
