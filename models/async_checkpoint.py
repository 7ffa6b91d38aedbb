"""The reference checkpointer in its asynchronous form: the same checkpoint as models/checkpoint.py,
written by `torch.distributed.checkpoint.async_save` while training goes on.

`save` returns what `async_save` returns (a future, or an `AsyncSaveResponse` with a staging and an
upload future), so the resume suite steps the optimizer before it resolves, as the official recipe
does. Each mode is feature-detected, never read off a version string: a release that lacks one
raises `UnavailableCheckpointMode` naming the missing API, and the resume suite skips the cell.
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from torchmatrix.testing import UnavailableCheckpointMode

from .checkpoint import Checkpointer


def staging_api():
    """`(DefaultStager, StagingOptions)` of torch.distributed.checkpoint.staging, or UnavailableCheckpointMode
    naming what this release lacks (the stager API and `async_save(async_stager=...)`; 2.9 has both)."""
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    except ImportError as missing:
        raise UnavailableCheckpointMode(
            f"torch {torch.__version__} has no torch.distributed.checkpoint.staging.DefaultStager/StagingOptions ({missing})"
        ) from None
    if "async_stager" not in inspect.signature(dcp.async_save).parameters:
        raise UnavailableCheckpointMode(f"torch {torch.__version__}'s dcp.async_save takes no async_stager")
    return DefaultStager, StagingOptions


class AsyncCheckpointer(Checkpointer):
    """`dcp.async_save` with DCP's own staging (a CPU copy made before `save` returns) and upload thread.

    The upload runs collectives in a background thread, so it gets a gloo group of its own: sharing
    the training's group would interleave them with FSDP's. `save` returns the upload's future.
    """

    def __init__(self):
        if not hasattr(dcp, "async_save"):
            raise UnavailableCheckpointMode(f"torch {torch.__version__} has no torch.distributed.checkpoint.async_save")
        self.save_group = None

    def save(self, directory: str, *, model, optimizer, scheduler, loader, step: int):
        state = self.state_to_save(model=model, optimizer=optimizer, scheduler=scheduler, loader=loader, step=step)
        return dcp.async_save(state, process_group=self.upload_group(), **self.save_arguments(directory, optimizer))

    def save_arguments(self, directory: str, optimizer) -> dict:
        """The `async_save` keywords besides the state and the group; subclasses add a stager or a writer."""
        return {"checkpoint_id": directory}

    def upload_group(self):
        """A gloo group over the ranks of `process_group`, made at the first save (a collective of every rank)."""
        if self.save_group is None and dist.is_initialized():
            ranks = dist.get_process_group_ranks(self.process_group) if self.process_group is not None else None
            self.save_group = dist.new_group(ranks=ranks, backend="gloo")
        return self.save_group


class StagedAsyncCheckpointer(AsyncCheckpointer):
    """`dcp.async_save` with one `DefaultStager` staging in a background thread, kept for every save of
    the run (reusing it is what pytorch#183413 broke in 2.11.0). `save` returns the `AsyncSaveResponse`:
    the suite waits for its staging before the optimizer steps, for its upload after."""

    pinned = False

    def __init__(self):
        super().__init__()
        self.stager = None

    def save_arguments(self, directory: str, optimizer) -> dict:
        if self.stager is None:
            self.stager = self.build_stager()
        return {"checkpoint_id": directory, "async_stager": self.stager}

    def build_stager(self):
        default_stager, staging_options = staging_api()
        return default_stager(
            staging_options(
                use_pinned_memory=self.pinned,
                use_shared_memory=False,
                use_async_staging=True,
                use_non_blocking_copy=self.pinned,
            )
        )

    def close(self) -> None:
        """Release the stager's thread and buffers once the run's last save is done."""
        if self.stager is not None:
            self.stager.close()
            self.stager = None


class PinnedAsyncCheckpointer(StagedAsyncCheckpointer):
    """Staging into pinned host memory with non-blocking copies, as torchtitan's `async_with_pinned_mem`
    does: only CUDA pins memory, so elsewhere it is unavailable rather than silently unpinned."""

    pinned = True

    def __init__(self):
        staging_api()
        if not torch.cuda.is_available():
            raise UnavailableCheckpointMode(
                "pinned-memory staging needs CUDA (torch.cuda.is_available() is False here): "
                "DefaultStager would silently stage into ordinary memory"
            )
        super().__init__()
