"""Which checkpointer a resume cell saves with: the `checkpointer` component, or, in the cells that
option `async_save` names, `checkpointer_async`, whose save the suite leaves in flight while the
optimizer steps. Torch-free, so the runner and the suites agree on it.
"""

from __future__ import annotations

import fnmatch

SYNC_COMPONENT = "checkpointer"
ASYNC_COMPONENT = "checkpointer_async"
ASYNC_DEFAULT = "torchmatrix.models.async_checkpoint:AsyncCheckpointer"


class UnavailableCheckpointMode(RuntimeError):
    """This torch or machine cannot save in the checkpointer's mode (a stager API the release lacks, pinned
    memory without CUDA); the message names what is missing, and the cell's resume tests skip with it."""


def saves_asynchronously(cell_id: str, patterns: tuple[str, ...]) -> bool:
    """Whether option `async_save` (globs over cell ids) names this cell."""
    return any(fnmatch.fnmatchcase(cell_id, pattern) for pattern in patterns)


def checkpointer_path(components: dict, asynchronous: bool) -> str:
    """The import path the cell saves and loads with: `checkpointer_async` (the reference's by default) or `checkpointer`."""
    return components.get(ASYNC_COMPONENT, ASYNC_DEFAULT) if asynchronous else components[SYNC_COMPONENT]
