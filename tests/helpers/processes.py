"""The processes a run left behind, found by a marker in their environment."""

from __future__ import annotations

import os
from pathlib import Path


def processes_with(marker: str) -> list[int]:
    """Live processes (not zombies) other than this one whose environment carries `marker`: every
    process a run starts inherits it (the runner, pytest, zygote, ranks)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if int(entry.name) != os.getpid() and marker.encode() in (entry / "environ").read_bytes():
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found
