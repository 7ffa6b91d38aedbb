"""Run groups of suite runs as pytest processes, in parallel up to the machine's slots.

Every group's process starts at once and imports torch and its suites while it waits at a gate;
the scheduler opens a gate (a small JSON file naming the group's GPUs or cores and threads) when
slots free up, so imports overlap with other groups' tests. Slots are GPUs on a CUDA box (each
group gets its own CUDA_VISIBLE_DEVICES slice) and cores on a CPU box (each group's ranks are
pinned to its own cores; fillers run unpinned on what the others leave idle). The scheduler
feeds events to the OutcomeBook, kills a process whose test hangs outside the rank pool, and on
Ctrl-C kills everything it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.forks.leftover_processes import descendants
from torchmatrix.forks.log_tail import last_lines
from torchmatrix.forks.preloaded_forks import ForkedProcess, PreloadedForks
from torchmatrix.matrix.plan import Group
from torchmatrix.messages.events import EventReader, stacks_path
from torchmatrix.messages.grant import Grant
from torchmatrix.run.interrupts import STOPPED
from torchmatrix.run.outcomes import OutcomeBook
from torchmatrix.status import Status

BACKSTOP_GRACE_S = 60.0
EXIT_GRACE_S = 30.0
"""How long a pytest process may take to exit once its last test reported (pool and zygote closed)."""
STACK_WAIT_S = 1.0
STACK_BYTES = 64 * 1024
POLL_S = 0.2
LOG_TAIL_LINES = 40
FILLER_NICE = 19  # CPU groups beyond the cores run at the lowest priority, on cycles the others leave idle


@dataclass
class GroupProcess:
    """One pytest process running a group, with its log, event stream and gate."""

    group: Group
    proc: subprocess.Popen | ForkedProcess
    log: Path
    events: EventReader
    gate: Path
    gpus: list[int] = field(default_factory=list)
    cores: list[int] = field(default_factory=list)
    slots: int = 0
    started_at: float = field(default_factory=time.monotonic)
    finished_at: float | None = None
    """When the book first had every test of the process's runs (it should exit soon after)."""

    @classmethod
    def start(
        cls,
        group: Group,
        command: list[str],
        *,
        cwd: Path,
        env: dict,
        log: Path,
        events: Path,
        gate: Path,
        forks: PreloadedForks | None = None,
    ) -> GroupProcess:
        """Start `command`, forked from the run's preloaded interpreter where `forks` can, else as a new process."""
        with file_writes.open_stream(log, "wb") as out:
            proc = forks.start(command, cwd=cwd, env=env, log=log) if forks else None
            if proc is None:
                proc = subprocess.Popen(
                    command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
        return cls(group, proc, log, EventReader(events), gate)

    def open(self, grant: Grant, slots: int) -> None:
        """Let the process run its tests with `grant`, counting `slots` of the machine as its own."""
        self.gpus, self.cores, self.slots = list(grant.gpus), list(grant.cores), slots
        grant.write(self.gate)

    def kill(self) -> None:
        """Kill the pytest process group (its zygote included) and every rank, each in its own session."""
        ranks = descendants(self.proc.pid)
        for pgid in [self.proc.pid, *ranks]:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()

    def stacks(self) -> str:
        """Every thread's Python stack in the process now, dumped by faulthandler on SIGUSR1 (the
        plugin registers it) into the file beside its event log; "" where it wrote none."""
        path = stacks_path(self.events.path)
        try:
            file_writes.open_stream(path).close()  # truncated in place: the process writes to this inode
            os.kill(self.proc.pid, signal.SIGUSR1)
            time.sleep(STACK_WAIT_S)
            return "\n".join(last_lines(path, 10_000, STACK_BYTES)).strip()
        except OSError:
            return ""

    def log_tail(self) -> str:
        try:
            lines = last_lines(self.log, LOG_TAIL_LINES)
        except OSError as error:  # a test removed the reports directory
            return f"(cannot read {self.log}: {error.strerror})"
        return f"last {len(lines)} lines of {self.log}:\n" + "\n".join(lines)

    @property
    def keys(self) -> list[str]:
        return [run.key for run in self.group.runs]


def exit_reason(code: int) -> str:
    if code < 0:
        return f"the pytest process was killed by {signal.Signals(-code).name}"
    meaning = {
        2: "interrupted",
        3: "internal error, or a test ended the process",
        4: "usage error",
        5: "no tests collected",
    }.get(code)
    return f"pytest exited with code {code}" + (f" ({meaning})" if meaning else "")


class Scheduler:
    """Opens groups' gates when slots free up and turns their events into outcomes.

    Every group's events feed `book`, or its own book in `books` (by group name: confirmation
    processes each re-run one test of a suite run the main book already holds). With
    `max_started`, groups start only as earlier ones finish, so that many at most import at once.
    """

    def __init__(
        self,
        groups: Sequence[Group],
        book: OutcomeBook | None,
        *,
        start: Callable[[Group], GroupProcess],
        slots: int,
        gpu_ids: Sequence[int] = (),
        core_ids: Sequence[int] = (),
        on_update: Callable[[], None] = lambda: None,
        books: Mapping[str, OutcomeBook] | None = None,
        max_started: int | None = None,
    ):
        self.groups = list(groups)
        self.book = book
        self.books = dict(books or {})
        self.max_started = max_started
        self.start = start
        self.slots = slots
        self.free_gpus = list(gpu_ids)
        self.use_gpus = bool(gpu_ids)
        self.free_cores = list(core_ids)
        self.on_update = on_update
        self.waiting: list[GroupProcess] = []
        self.active: list[GroupProcess] = []

    def run(self) -> None:
        """Run every group to completion; on Ctrl-C (or an error) kill them all, record why, and re-raise."""
        pending = list(self.groups)
        try:
            while pending or self.waiting or self.active:
                while pending and (self.max_started is None or len(self.waiting + self.active) < self.max_started):
                    self.waiting.append(self.start(pending.pop(0)))
                self._open_what_fits()
                self._poll()
                self.on_update()
                time.sleep(POLL_S)
        except BaseException as error:  # Ctrl-C, or a report it could not write: nothing it started keeps running
            for process in self.waiting + self.active:
                process.kill()
            if not isinstance(error, KeyboardInterrupt):
                raise
            now = time.monotonic()
            for process in self.waiting + self.active:  # what each wrote since the last poll: its tests' names
                self._read_events(process, now)
            for book in {id(b): b for b in [self.book, *self.books.values()] if b is not None}.values():
                for key in book.runs:
                    if not book.is_done(key):
                        book.fail_run(key, Status.ERROR, STOPPED)
            raise

    def _used_slots(self) -> int:
        return sum(p.slots for p in self.active)

    def _open_what_fits(self) -> None:
        for process in list(self.waiting):
            group = process.group
            nice, cores = 0, []
            if group.launcher:
                if self.active:
                    continue
                gpus, self.free_gpus = self.free_gpus, []
                slots = self.slots
            elif self.use_gpus:
                if len(self.free_gpus) < group.world_size:
                    continue
                gpus, self.free_gpus = self.free_gpus[: group.world_size], self.free_gpus[group.world_size :]
                slots = group.world_size
            else:
                slots = min(group.world_size, self.slots)
                if self.active and self._used_slots() + slots > self.slots:
                    if any(p.group.launcher for p in self.active):
                        continue
                    nice, slots = FILLER_NICE, 0
                cores, self.free_cores = self.free_cores[:slots], self.free_cores[slots:]
                gpus = []
            process.open(Grant.for_group(group.world_size, slots, gpus=gpus, cores=cores, nice=nice), slots)
            self.waiting.remove(process)
            self.active.append(process)

    def _book(self, process: GroupProcess) -> OutcomeBook:
        return self.books.get(process.group.name, self.book)

    def _read_events(self, process: GroupProcess, now: float) -> None:
        """Feed what `process` wrote to its event log since the last read into its book."""
        book = self._book(process)
        for event in process.events.read_new():
            book.feed(event, now)

    def _poll(self) -> None:
        now = time.monotonic()
        for process in self.active + self.waiting:
            book = self._book(process)
            self._read_events(process, now)
            code = process.proc.poll()
            if code is None:
                hung = self._hung_test(process, now) if process in self.active else None
                held = None if hung else self._held(process, now)
                if hung is None and held is None:
                    continue
                stacks = process.stacks() if held else ""
                process.kill()
                evidence = process.log_tail() + (f"\nPython stacks of the pytest process:\n{stacks}" if stacks else "")
                if hung:
                    book.close_group(process.keys, hung, process.log_tail())
                elif process.finished_at is not None:
                    book.fail_last_tests(process.keys, held, evidence)
                else:
                    book.close_group(process.keys, held, evidence)
            else:
                self._read_events(process, now)
                book.close_group(process.keys, f"{exit_reason(code)} before this suite reported", process.log_tail())
            if process in self.active:
                self.active.remove(process)
                self.free_gpus.extend(process.gpus)
                self.free_cores.extend(process.cores)
            else:
                self.waiting.remove(process)

    def _held(self, process: GroupProcess, now: float) -> str | None:
        """Why a pytest process must be killed though no test runs: it has not collected its tests
        within the longest deadline of its suites plus the grace a hung test gets (a suite that
        blocks at import), or not exited EXIT_GRACE_S after its last test (a thread left running)."""
        book = self._book(process)
        collected = all(book.expected[key] is not None or key in book.closed for key in process.keys)
        if not collected:
            limit = max(book.runs[key].suite.timeout for key in process.keys) + BACKSTOP_GRACE_S
            if now - process.started_at > limit:
                return f"the pytest process had not collected its tests {now - process.started_at:.0f}s after it started (a suite that blocks at import?); it was killed"
            return None
        if not all(book.is_done(key) for key in process.keys) or any(key in book.running for key in process.keys):
            return None
        process.finished_at = process.finished_at or now
        if now - process.finished_at > EXIT_GRACE_S:
            return f"the pytest process did not exit {EXIT_GRACE_S:.0f}s after its last test (a thread a test left running?); it was killed"
        return None

    def _hung_test(self, process: GroupProcess, now: float) -> str | None:
        """A test running past its deadline plus a grace: it hangs outside the rank pool's control."""
        book = self._book(process)
        for key in process.keys:
            if key in book.running:
                test, since = book.running[key]
                limit = book.runs[key].suite.timeout + BACKSTOP_GRACE_S
                if now - since > limit:
                    return f"{test} ran {now - since:.0f}s, past its deadline plus {BACKSTOP_GRACE_S:.0f}s grace, outside the rank pool; the pytest process was killed"
        return None
