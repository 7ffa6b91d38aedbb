"""A known-bad checkpointer for the cross_version suite: every version reads its own checkpoints,
no version reads another's, so suites/test_resume.py passes on it and only a cross-version read catches it.

Point `[components] checkpointer` at it to see the rollback and forward directions fail.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..checkpoint import Checkpointer

TAG_FILE = "written_by_torch.txt"


class VersionTaggedCheckpointer(Checkpointer):
    """Tags each checkpoint with the torch that wrote it and refuses to load one another torch wrote,
    as a format field an older reader rejects would."""

    def save(self, directory: str, **state) -> None:
        super().save(directory, **state)
        Path(directory, TAG_FILE).write_text(torch.__version__)

    def load(self, directory: str, **state) -> int:
        written_by = Path(directory, TAG_FILE).read_text()
        if written_by != torch.__version__:
            raise RuntimeError(f"checkpoint format of torch {written_by} is not readable by torch {torch.__version__}")
        return super().load(directory, **state)
