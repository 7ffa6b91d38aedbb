"""The two forms of the `checkpointer` component behind the one face the suites call.

A per-call checkpointer (a zero-argument factory whose object takes the training objects at every
`save(directory, ...)` and `load(directory, ...)`) and a bound one (a checkpoint manager built once
with the directory, model, optimizer, scheduler, loader and, where its signature names them, a
process group or mesh, then `save(step)` and `load()`) both become `save(step) -> extra state` and
`load() -> (step, extra state)`, so the suites compare what a manager's `load` returns besides the step.

Either form's `save` may be asynchronous: it returns a future (anything with `result()`, such as
`dcp.async_save`'s), or an object with `staging_completion` and `upload_completion` futures (DCP's
`AsyncSaveResponse`); `SaveInFlight` is that save until its upload is done.
"""

from __future__ import annotations

from collections.abc import Mapping

from torchmatrix.testing import accepts, call_accepting, cell_mesh, is_bound_checkpointer, mesh_group

PROCESS_KEYWORDS = ("process_group", "mesh")


def reshards_itself(factory) -> bool:
    """Whether the checkpointer can save and load in a world of the suite's choosing: the bound
    form with a `process_group` or `mesh` keyword."""
    return is_bound_checkpointer(factory) and any(accepts(factory, keyword) for keyword in PROCESS_KEYWORDS)


class RunCheckpointer:
    """One training run's checkpointer over `directory`, in either form.

    `process_group` and `mesh` reach a bound checkpointer whose signature names them; None means
    the whole world, as `cell`'s mesh (torchmatrix.testing.cell_mesh; 1-D without a cell), built only
    if the signature asks for one, and the process group over all of its ranks."""

    def __init__(
        self, factory, directory: str, *, model, optimizer, scheduler, loader, process_group=None, mesh=None, cell=None
    ):
        self.objects = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader}
        self.directory = directory
        self.name = f"{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', repr(factory))}"
        if is_bound_checkpointer(factory):
            if mesh is None and accepts(factory, "mesh"):
                mesh = cell_mesh(cell or {})
            if process_group is None and accepts(factory, "process_group"):
                process_group = mesh_group(mesh) if mesh is not None else world_group()
            self.bound = call_accepting(factory, directory, **self.objects, process_group=process_group, mesh=mesh)
            self.per_call = None
        else:
            self.bound, self.per_call = None, factory()

    def save(self, step: int) -> dict:
        """Save at `step`, waiting for an asynchronous save's upload before returning; the extra state
        the checkpointer says it wrote (empty when it returns None)."""
        return self.start_save(step).result()

    def start_save(self, step: int) -> SaveInFlight:
        """Save at `step` and return at once: the save, in flight where the checkpointer saves asynchronously."""
        if self.bound is not None:
            return SaveInFlight(self.bound.save(step), self.name)
        return SaveInFlight(self.per_call.save(self.directory, step=step, **self.objects), self.name)

    def close(self) -> None:
        """Let the checkpointer release what it keeps between saves (a stager's thread), where it has `close`."""
        close = getattr(self.bound if self.bound is not None else self.per_call, "close", None)
        if callable(close):
            close()

    def load(self) -> tuple[int, dict]:
        """Load; the step it was saved at and the extra state `load` returned beside it."""
        returned = self.bound.load() if self.bound is not None else self.per_call.load(self.directory, **self.objects)
        if isinstance(returned, Mapping):
            if "step" not in returned:
                raise TypeError(
                    f'checkpointer {self.name}: load returned a mapping without "step" ({sorted(map(str, returned))}); put the saved step under "step"'
                )
            return int(returned["step"]), {key: value for key, value in returned.items() if key != "step"}
        if isinstance(returned, bool) or not isinstance(returned, int):
            raise TypeError(
                f'checkpointer {self.name}: load returned {type(returned).__name__}; return the saved step, or a mapping with "step" and the extra state'
            )
        return returned, {}


class SaveInFlight:
    """What one `save` returned: the extra state at once for a synchronous save, else the futures of an
    asynchronous one, whose staging must be done before the training objects change again."""

    def __init__(self, returned, checkpointer: str):
        self.checkpointer = checkpointer
        self.staging = self.upload = None
        self.returned = returned
        if hasattr(returned, "staging_completion") and hasattr(returned, "upload_completion"):
            self.staging, self.upload = returned.staging_completion, returned.upload_completion
        elif callable(getattr(returned, "result", None)):
            self.upload = returned

    @property
    def is_asynchronous(self) -> bool:
        return self.upload is not None

    def wait_for_staging(self) -> None:
        """Block until the save no longer reads the training objects (at once for all but a staged save)."""
        if self.staging is not None:
            self.staging.result()

    def uploading(self) -> bool:
        """Whether the upload is still running now."""
        return self.upload is not None and not self.upload.done()

    def result(self) -> dict:
        """Wait for the upload; the extra state the save wrote. A future's result that is not a mapping
        (None, DCP's metadata) means none; a synchronous save must return None or a mapping."""
        if self.upload is not None:
            self.wait_for_staging()
            value = self.upload.result()
            return dict(value) if isinstance(value, Mapping) else {}
        if self.returned is None:
            return {}
        if not isinstance(self.returned, Mapping):
            raise TypeError(
                f"checkpointer {self.checkpointer}: save returned {type(self.returned).__name__}; return None, a mapping "
                "of the extra state it wrote, or the future of an asynchronous save"
            )
        return dict(self.returned)


def world_group():
    import torch.distributed as dist

    return dist.group.WORLD
