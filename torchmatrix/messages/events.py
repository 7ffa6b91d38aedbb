"""The event log a pytest process writes as it goes, one JSON object per line.

Writing each test's result the moment it finishes (instead of one JUnit file at exit) is what
keeps results when the process is killed later: the runner reads what is there and knows
exactly which tests never reported. Each kind of event is one dataclass here, written and read
by the same definition; the log opens with its format version, since `torchmatrix report`
replays logs that an earlier runner (or another torchmatrix install) left behind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from torchmatrix import file_writes, json_records
from torchmatrix.json_records import json_field
from torchmatrix.matrix.plan import run_key
from torchmatrix.status import Confirmation, Status

FORMAT_VERSION = 2  # 2: TestStarted carries when the test started


class EventLogError(ValueError):
    """A line that is not an event this torchmatrix writes; the message names what is wrong."""


@dataclass(frozen=True)
class LogOpened:
    """The first line of every log: which format the rest is in."""

    kind: ClassVar[str] = "log"
    format_version: int = FORMAT_VERSION


@dataclass(frozen=True)
class Collected:
    """The tests collection found, per run key (so a process that dies later still names them)."""

    kind: ClassVar[str] = "collected"
    runs: dict[str, list[str]]


@dataclass(frozen=True)
class TestStarted:
    """A test began (the runner's backstop times hangs from here) at `started`, epoch seconds: a
    cell's JUnit timestamp, also when `report` rebuilds it from the log long after."""

    __test__ = False  # a record, not a pytest test class
    kind: ClassVar[str] = "start"
    suite: str
    cell: str
    test: str
    started: float

    @property
    def key(self) -> str:
        return run_key(self.suite, self.cell)


@dataclass
class TestOutcome:
    """One test's combined setup/call/teardown result, as JUnit shows it: logged by the pytest
    process (as TestFinished), kept by the runner's ledger, marked by its confirmation re-run."""

    __test__ = False  # a record, not a pytest test class
    suite: str
    test: str
    status: Status
    duration: float = 0.0
    message: str = ""
    text: str = ""
    properties: list = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    confirmation: Confirmation | None = field(default=None, metadata=json_field(dump=Confirmation.written))
    confirmation_note: str = ""
    """What the re-run alone showed (its status and message), or why the failure was not re-run."""

    def __post_init__(self) -> None:
        self.status = Status.parse(self.status, "test event status")
        self.confirmation = Confirmation.parse(self.confirmation, "test event confirmation")


@dataclass(kw_only=True)
class TestFinished(TestOutcome):
    """The event of a finished test: its outcome, and the node and cell it ran as."""

    kind: ClassVar[str] = "test"
    nodeid: str
    cell: str

    @property
    def key(self) -> str:
        return run_key(self.suite, self.cell)


@dataclass(frozen=True)
class CollectError:
    """A suite file that could not be collected: every run of that suite errors with `text`."""

    kind: ClassVar[str] = "collect_error"
    suite: str | None
    nodeid: str
    text: str


@dataclass(frozen=True)
class PoolStarted:
    """The process (re)started its rank pool (counted in plan.json's pool_starts)."""

    kind: ClassVar[str] = "pool_start"
    world_size: int


Event = LogOpened | Collected | TestStarted | TestFinished | CollectError | PoolStarted
EVENT_TYPES = {cls.kind: cls for cls in (LogOpened, Collected, TestStarted, TestFinished, CollectError, PoolStarted)}


def to_json(event: Event) -> dict:
    """A log line's object: the event's kind, then its fields."""
    return {"event": event.kind, **json_records.to_json(event)}


def from_json(data: dict) -> Event:
    """The event a log line holds; a kind, field or format this torchmatrix does not write is refused."""
    try:
        cls = EVENT_TYPES[data["event"]]
        event = json_records.from_json(cls, {key: value for key, value in data.items() if key != "event"})
    except (KeyError, TypeError, ValueError) as error:
        raise EventLogError(f"not an event this torchmatrix writes ({error!r}): {json.dumps(data)[:200]}") from None
    if isinstance(event, LogOpened) and event.format_version != FORMAT_VERSION:
        raise EventLogError(
            f"an event log of format {event.format_version}, not {FORMAT_VERSION}: written by another torchmatrix version"
        )
    return event


def stacks_path(events: str | Path) -> Path:
    """Where a pytest process writes every thread's Python stack when the runner sends it SIGUSR1
    (beside its event log): what held a process that did not collect or did not exit in time."""
    return Path(f"{events}.stacks")


class EventLog:
    """Appends events to a file, flushed per line so a reader never sees half a record."""

    def __init__(self, path: str | Path):
        self._file = file_writes.open_stream(path, "a", encoding="utf-8")
        if self._file.tell() == 0:
            self.write(LogOpened())

    def write(self, event: Event) -> None:
        self._file.write(json.dumps(to_json(event), default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class EventReader:
    """Reads the complete lines appended to an event log since the last call."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._offset = 0

    def read_new(self) -> list[Event]:
        try:
            with open(self.path, "rb") as file:
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        lines = complete.decode("utf-8").splitlines()
        try:
            return [from_json(json.loads(line)) for line in lines if line.strip()]
        except (json.JSONDecodeError, EventLogError) as error:
            raise EventLogError(f"{self.path}: {error}") from None
