"""Known-bad checkpointers for the cross_version suite: each version reads its own checkpoints, so
suites/test_resume.py passes on them and only a cross-version read catches them.

Point `[components] checkpointer` at `VersionTaggedCheckpointer` to see the rollback and forward
directions fail, at `NewFormatCheckpointer` to see the rollback fail from one release on (what
`torchmatrix bisect` finds).
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import torch

from ..checkpoint import Checkpointer

TAG_FILE = "written_by_torch.txt"
FORMAT_FILE = "checkpoint_format.json"


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


def installed_release() -> tuple[int, int]:
    """The (major, minor) of the torch distribution pip installed (its metadata, as a bisect's step installs it)."""
    major, minor = metadata.version("torch").split("+", 1)[0].split(".")[:2]
    return int(major), int(minor)


class NewFormatCheckpointer(Checkpointer):
    """From torch `first_new_format` on, tags each checkpoint with a format field that a release
    before it refuses, as torch 2.13.0's DCP reader refuses 2.15.0's metadata: the rollback breaks at
    that release, the forward direction and every release's own checkpoints load."""

    first_new_format = (2, 14)

    def save(self, directory: str, **state) -> None:
        super().save(directory, **state)
        if installed_release() >= self.first_new_format:
            Path(directory, FORMAT_FILE).write_text(json.dumps({"format": 2, "written_by": metadata.version("torch")}))

    def load(self, directory: str, **state) -> int:
        tagged = Path(directory, FORMAT_FILE)
        if tagged.is_file() and installed_release() < self.first_new_format:
            written_by = json.loads(tagged.read_text())["written_by"]
            raise RuntimeError(
                f"checkpoint format 2 (written by torch {written_by}) is not readable by torch {metadata.version('torch')}"
            )
        return super().load(directory, **state)
