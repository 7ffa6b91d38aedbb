"""The two forms of the `checkpointer` component behind the one face the suites call.

A per-call checkpointer (a zero-argument factory whose object takes the training objects at every
`save(directory, ...)` and `load(directory, ...)`) and a bound one (a checkpoint manager built once
with the directory, model, optimizer, scheduler, loader and, where its signature names them, a
process group or mesh, then `save(step)` and `load()`) both become `save(step) -> extra state` and
`load() -> (step, extra state)`, so the suites compare what a manager's `load` returns besides the step.
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
        """Save at `step`; the extra state the checkpointer says it wrote (empty when it returns None)."""
        if self.bound is not None:
            returned = self.bound.save(step)
        else:
            returned = self.per_call.save(self.directory, step=step, **self.objects)
        if returned is None:
            return {}
        if not isinstance(returned, Mapping):
            raise TypeError(
                f"checkpointer {self.name}: save returned {type(returned).__name__}; return None, or a mapping of the extra state it wrote"
            )
        return dict(returned)

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


def world_group():
    import torch.distributed as dist

    return dist.group.WORLD
