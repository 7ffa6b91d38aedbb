"""Known-bad asynchronous checkpointers for the resume suite, each modelled on a public case, and the
valid controls beside them; suites/test_resume.py must fail on every mutant and pass every control.

Where a bug shows only when the upload is slower than the next training step (an alias of a live
tensor is harmless once written), the mutant writes through `WriteAfterNextStep`: the schedule in
which the bug shows, made certain instead of left to the threads' timing.
"""

from __future__ import annotations

import threading

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.staging import AsyncStager, DefaultStager, StagingOptions
from torch.utils._pytree import tree_map_only

from ..async_checkpoint import AsyncCheckpointer, StagedAsyncCheckpointer

STEP_WAIT_S = 120


class WriteAfterNextStep(FileSystemWriter):
    """A storage writer slower than one training step: it writes once the optimizer has stepped after
    the save (an optimizer step post-hook), as a slow filesystem or object store does."""

    def __init__(self, directory: str, optimizer):
        super().__init__(directory)
        self.stepped = threading.Event()
        self.hook = optimizer.register_step_post_hook(lambda *args: self.stepped.set())

    def write_data(self, plan, planner):
        if not self.stepped.wait(STEP_WAIT_S):
            raise TimeoutError(f"the optimizer did not step within {STEP_WAIT_S} s of the save this writer waits on")
        self.hook.remove()
        return super().write_data(plan, planner)


class AliasingStager(AsyncStager):
    """Stages by copying each tensor, except those `aliases` keeps as they are: the live tensors the
    optimizer goes on updating in place."""

    _synchronize_after_execute = False

    def __init__(self, aliases):
        self.aliases = aliases

    def stage(self, state_dict):
        return tree_map_only(torch.Tensor, lambda t: t if self.aliases(t) else t.detach().clone(), state_dict)

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        pass


def on_the_cpu(tensor: torch.Tensor) -> bool:
    """pytorch#144657: staging was `tensor.to("cpu")`, a no-op that copies nothing for a tensor already there."""
    return tensor.device.type == "cpu"


def zero_dimensional(tensor: torch.Tensor) -> bool:
    """nvidia-resiliency-ext PR #376: the device tensors were copied, the CPU ones (AdamW's 0-d `step`,
    kept on the CPU beside CUDA params) moved into shared memory without a snapshot. On a CPU-only
    machine every tensor is on the CPU, so the 0-d ones stand for them."""
    return tensor.dim() == 0


class UnstagedCpuTensorsCheckpointer(AsyncCheckpointer):
    """pytorch#144657 (fixed in 2.7, PR #145408): `async_save` staged with `tensor.to("cpu")`, so CPU
    tensors were written from the live ones after the next step had changed them: every parameter
    and moment in the checkpoint holds the next step's value."""

    stager_aliases = staticmethod(on_the_cpu)

    def save_arguments(self, directory: str, optimizer) -> dict:
        return {
            "storage_writer": WriteAfterNextStep(directory, optimizer),
            "async_stager": AliasingStager(self.stager_aliases),
        }


class TornStepCheckpointer(UnstagedCpuTensorsCheckpointer):
    """nvidia-resiliency-ext PR #376: a torn checkpoint, AdamW's `step` from the step after the save
    and the parameters and moments from the save (bias correction off by one on resume)."""

    stager_aliases = staticmethod(zero_dimensional)


class StagerClosedAfterStage(DefaultStager):
    """DefaultStager as 2.11.0 shipped it (PR #170431): `_stage` closes its StateDictStager when done,
    which drops the deepcopy dispatch table, so its next stage fails with `KeyError: <class 'type'>`."""

    def _stage(self, state_dict, **kwargs):
        try:
            return super()._stage(state_dict, **kwargs)
        finally:
            self._state_dict_stager.close()


class StagerNotReusableCheckpointer(StagedAsyncCheckpointer):
    """pytorch#183413: the run's one stager, reused for its second save, crashes it."""

    def build_stager(self):
        return StagerClosedAfterStage(
            StagingOptions(
                use_pinned_memory=False, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=False
            )
        )


class AwaitedUnstagedCheckpointer(UnstagedCpuTensorsCheckpointer):
    """Control: pytorch#144657's aliasing stager, but the save is awaited before `save` returns, so no
    step can run while it is in flight: valid, and the suite must pass it. (No slow writer: it would
    wait for a step that the await holds back.)"""

    def save(self, directory: str, *, model, optimizer, scheduler, loader, step: int):
        future = super().save(
            directory, model=model, optimizer=optimizer, scheduler=scheduler, loader=loader, step=step
        )
        future.result()
        return future

    def save_arguments(self, directory: str, optimizer) -> dict:
        return {"checkpoint_id": directory, "async_stager": AliasingStager(self.stager_aliases)}


class SlowWriterCheckpointer(AsyncCheckpointer):
    """Control: DCP's own staging (a copy) with the writer that waits for the next step: the upload
    is as late as the mutants', and the checkpoint still holds the save's state."""

    def save_arguments(self, directory: str, optimizer) -> dict:
        return {"storage_writer": WriteAfterNextStep(directory, optimizer)}
