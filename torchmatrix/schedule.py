"""Run groups of suite runs as pytest processes, in parallel up to the machine's slots.

Slots are GPUs on a CUDA box (each group gets its own CUDA_VISIBLE_DEVICES slice) and cores on
a CPU box. Each process streams events; the scheduler feeds them to the OutcomeBook, kills a
process whose test hangs outside the rank pool, and on Ctrl-C kills everything it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torchmatrix.events import EventReader
from torchmatrix.outcomes import OutcomeBook
from torchmatrix.plan import Group

BACKSTOP_GRACE_S = 60.0
POLL_S = 0.2
LOG_TAIL_LINES = 40


@dataclass
class GroupProcess:
    """One pytest process running a group, with its log and event stream."""

    group: Group
    proc: subprocess.Popen
    log: Path
    events: EventReader
    gpus: list[int] = field(default_factory=list)
    slots: int = 1

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
        gpus: list[int],
        slots: int,
    ) -> GroupProcess:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return cls(group, proc, log, EventReader(events), gpus, slots)

    def kill(self) -> None:
        """Kill the pytest process group and the rank processes it started in their own sessions."""
        ranks = _children(self.proc.pid)
        for pgid in [self.proc.pid, *ranks]:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()

    def log_tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        return f"last {len(lines)} lines of {self.log}:\n" + "\n".join(lines)

    @property
    def keys(self) -> list[str]:
        return [run.key for run in self.group.runs]


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (read from /proc before the parent dies and they are re-parented)."""
    children = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            children.append(int(entry.name))
    return children


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
    """Starts groups when slots free up and turns their events into outcomes."""

    def __init__(
        self,
        groups: Sequence[Group],
        book: OutcomeBook,
        *,
        start: Callable[[Group, list[int], int], GroupProcess],
        slots: int,
        gpu_ids: Sequence[int] = (),
        on_update: Callable[[], None] = lambda: None,
    ):
        self.pending = list(groups)
        self.book = book
        self.start = start
        self.slots = slots
        self.free_gpus = list(gpu_ids)
        self.use_gpus = bool(gpu_ids)
        self.on_update = on_update
        self.active: list[GroupProcess] = []

    def run(self) -> None:
        """Run every group to completion; on Ctrl-C kill them all, record why, and re-raise."""
        try:
            while self.pending or self.active:
                self._start_what_fits()
                self._poll()
                self.on_update()
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            for process in self.active:
                process.kill()
            for key in self.book.runs:
                if not self.book.is_done(key):
                    self.book.fail_run(key, "error", "interrupted (Ctrl-C or SIGTERM) before this suite finished")
            raise

    def _used_slots(self) -> int:
        return sum(p.slots for p in self.active)

    def _start_what_fits(self) -> None:
        for group in list(self.pending):
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
                    continue
                gpus = []
            self.pending.remove(group)
            self.active.append(self.start(group, gpus, slots))

    def _poll(self) -> None:
        now = time.monotonic()
        for process in list(self.active):
            for event in process.events.read_new():
                self.book.feed(event, now)
            code = process.proc.poll()
            if code is None:
                hung = self._hung_test(process, now)
                if hung is None:
                    continue
                process.kill()
                self.book.close_group(process.keys, hung, process.log_tail())
            else:
                for event in process.events.read_new():
                    self.book.feed(event, now)
                self.book.close_group(
                    process.keys, f"{exit_reason(code)} before this suite reported", process.log_tail()
                )
            self.active.remove(process)
            self.free_gpus.extend(process.gpus)

    def _hung_test(self, process: GroupProcess, now: float) -> str | None:
        """A test running past its deadline plus a grace: it hangs outside the rank pool's control."""
        for key in process.keys:
            if key in self.book.running:
                test, since = self.book.running[key]
                limit = self.book.runs[key].suite.timeout + BACKSTOP_GRACE_S
                if now - since > limit:
                    return f"{test} ran {now - since:.0f}s, past its deadline plus {BACKSTOP_GRACE_S:.0f}s grace, outside the rank pool; the pytest process was killed"
        return None
