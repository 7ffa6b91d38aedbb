"""Known failures a compiling cell's store folder has seen fail, so that a warm run reports them from
there instead of paying their compiles again only to fail the same way.

The folder's key holds everything the test's outcome depends on that the cell id does not say (the
torch build, the compiler, the device, every source of the suites and components, the options), so
under it a run repeats the failure it recorded. Only `[[known_failure]]` tests are recalled, and only
in cells that compile: any other test, and a known failure whose entry is gone, runs.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.messages.compile_store import KNOWN_FAILURES

RECALLED = "known_failure_recalled"
"""The property of a known failure reported from the store: when it failed there, and with what root cause."""


@dataclass(frozen=True)
class RecordedFailure:
    """How a known failure failed under this key, and when (UTC, to the minute)."""

    root_cause: str
    recorded: str


def recorded_failure(cell_folder: Path, test: str) -> RecordedFailure | None:
    """What `test` (`suite::name`) failed with the last time it ran in this cell folder; None if it never failed here."""
    entry = _read(cell_folder).get(test)
    if not isinstance(entry, dict) or not isinstance(entry.get("root_cause"), str):
        return None
    return RecordedFailure(entry["root_cause"], str(entry.get("recorded", "")))


def record_failure(cell_folder: Path, test: str, root_cause: str) -> None:
    """Keep that `test` failed here with `root_cause`; a store that cannot be written only loses the memo."""
    memo = _read(cell_folder)
    memo[test] = {"root_cause": root_cause, "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        cell_folder.mkdir(parents=True, exist_ok=True)
        file_writes.write_text(cell_folder / KNOWN_FAILURES, json.dumps(memo, sort_keys=True, indent=1))
    except OSError:
        pass


def recalled_reason(reason: str) -> str:
    """The expected failure's reason as a recalled one reports it: the entry's, then why it did not run (one
    line for every recalled test of the entry, which the summary groups by it)."""
    return (
        f"{reason} (not run again: it failed in an earlier run under this compile key, the same torch build, "
        "sources and options; --cold-compile runs it)"
    )


def recalled_property(recorded: RecordedFailure) -> str:
    """The `known_failure_recalled` property's value: when the test failed, and its root cause then."""
    return f"{recorded.recorded}: {recorded.root_cause}"


def _read(cell_folder: Path) -> dict:
    try:
        memo = json.loads((cell_folder / KNOWN_FAILURES).read_text())
    except (OSError, ValueError):
        return {}
    return memo if isinstance(memo, dict) else {}
