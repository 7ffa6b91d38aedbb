"""The event log a pytest process writes as it goes, one JSON object per line.

Writing each test's result the moment it finishes (instead of one JUnit file at exit) is what
keeps results when the process is killed later: the runner reads what is there and knows
exactly which tests never reported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def run_key(suite: str, cell_id: str) -> str:
    """Names one suite run for one (representative) cell."""
    return f"{suite}|{cell_id}"


class EventLog:
    """Appends events to a file, flushed per line so a reader never sees half a record."""

    def __init__(self, path: str | Path):
        self._file = open(path, "a", encoding="utf-8")

    def write(self, kind: str, **fields: Any) -> None:
        self._file.write(json.dumps({"event": kind, **fields}, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class EventReader:
    """Reads the complete lines appended to an event log since the last call."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._offset = 0

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as file:
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        return [json.loads(line) for line in complete.decode("utf-8").splitlines() if line.strip()]
