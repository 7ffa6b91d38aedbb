"""The last lines of a log, read from its end: a rank or a pytest process may have printed
gigabytes before it died, and only its last lines are quoted in the failure."""

from __future__ import annotations

import os
from pathlib import Path

TAIL_BYTES = 64 * 1024
"""The most of a log's end read to find its last lines (far more than they take)."""


def last_lines(path: Path, count: int, max_bytes: int = TAIL_BYTES) -> list[str]:
    """The last `count` lines of `path` within its last `max_bytes` (OSError where it cannot be read)."""
    with open(path, "rb") as file:
        size = file.seek(0, os.SEEK_END)
        start = max(0, size - max_bytes)
        file.seek(start)
        data = file.read(max_bytes)
    lines = data.decode("utf-8", errors="replace").splitlines()
    if start > 0 and lines:
        lines = lines[1:]  # the first may be cut mid-line
    return lines[-count:]
