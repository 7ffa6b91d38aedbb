"""What a test leaves besides its result, per process: the CPU seconds it used, the seconds it spent
in torch.compile (torchmatrix.ranks.compile_time), the memory it held at its highest
(torchmatrix.ranks.memory_peaks) and the warnings it raised.

Each rank process counts its warnings (WarningLog, installed when the rank starts) and the plugin
asks every rank for `rank_usage()` before and after each test, adding its own process's CPU time and
the warnings pytest recorded. Messages are normalised (addresses, line numbers, temporary paths) so
the same warning from two runs or two torch versions is one entry.
"""

from __future__ import annotations

import os
import re
import warnings
from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

from torchmatrix.messages.events import Event, TestFinished
from torchmatrix.messages.properties import CPU_SECONDS
from torchmatrix.ranks.compile_time import compile_seconds
from torchmatrix.ranks.memory_peaks import peaks_since_last_reading

ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
LINE = re.compile(r"(line |:)\d+\b")
TEMPORARY = re.compile(r"/tmp/[^\s'\"]+")
MESSAGE_CHARS = 500


def normalised(message: str) -> str:
    """The warning's text with what differs between runs (addresses, line numbers, temp paths) replaced."""
    text = TEMPORARY.sub("/tmp/…", ADDRESS.sub("0x…", str(message)))
    return LINE.sub(lambda m: f"{m.group(1)}N", " ".join(text.split()))[:MESSAGE_CHARS]


def module_of(filename: str) -> str:
    """The dotted module a warning's file is, from the package root it lives under (torch.distributed.fsdp…)."""
    path = filename.replace("\\", "/").removesuffix(".py")
    for marker in ("/site-packages/", "/dist-packages/", "/lib/python3"):
        if marker in path:
            path = path.rsplit(marker, 1)[1]
            break
    else:
        path = path.rsplit("/", 1)[-1]
    return path.strip("/").replace("/", ".").removesuffix(".__init__")


class WarningLog:
    """Every warning this process raises, counted by (category, module, normalised message) until drained."""

    def __init__(self):
        self.counts: Counter[tuple[str, str, str]] = Counter()

    def install(self) -> None:
        """Record every warning, each occurrence (not once per place), instead of printing it."""
        warnings.simplefilter("always")
        warnings.showwarning = self.record

    def record(self, message, category, filename, lineno, file=None, line=None) -> None:
        self.counts[(category.__name__, module_of(filename), normalised(message))] += 1

    def drain(self) -> list[dict]:
        """The warnings recorded since the last drain, as dicts, and forget them."""
        drained = as_entries(self.counts)
        self.counts.clear()
        return drained


def as_entries(counts: Counter) -> list[dict]:
    """(category, module, message) -> count as the records reports keep, most frequent first."""
    return [
        {"category": category, "module": module, "message": message, "count": count}
        for (category, module, message), count in counts.most_common()
    ]


RANK_WARNINGS = WarningLog()


class Usage(NamedTuple):
    """What the ranks and pytest have used so far: CPU seconds together, the warnings since the last
    query, each rank's compile seconds (ranks compile side by side, so a test's figure is the
    slowest rank's growth), how many stopped ranks' CPU could not be read (a test during which
    that grew has no true figure), and the largest rank's memory peaks since the last query."""

    cpu_seconds: float
    warnings: Counter
    compile_seconds: tuple[float, ...]
    unread_ranks: int = 0
    memory_peaks: dict | None = None

    def compiled_since(self, before: Usage) -> float:
        """The most seconds any rank spent compiling since ``before`` (0 where a rank restarted)."""
        return max(
            (max(now - then, 0.0) for now, then in zip(self.compile_seconds, before.compile_seconds)), default=0.0
        )


def cpu_seconds_once(events: Iterable[Event]) -> float:
    """The CPU seconds the tests of event logs used, each execution counted once: a run that stands
    for several cells is one TestFinished event but one JUnit testcase per cell it covers."""
    return sum(
        float(value)
        for event in events
        if isinstance(event, TestFinished)
        for name, value in event.properties
        if name == CPU_SECONDS
    )


def rank_usage() -> dict:
    """Rank function: this rank's CPU seconds and compile seconds so far, its warnings and memory peaks
    since the last call. The CPU counts all its threads (gloo's too) and the children it waited for: the
    C++ compiler Inductor runs per kernel is most of a compiled test's CPU."""
    return {
        "cpu_seconds": process_cpu_seconds(),
        "compile_seconds": compile_seconds(),
        "warnings": RANK_WARNINGS.drain(),
        "memory_peaks": peaks_since_last_reading(),
    }


def process_cpu_seconds() -> float:
    """User and system time of this process and of the children it has waited for."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def cpu_seconds_of(pid: int) -> float | None:
    """What process_cpu_seconds would say in process `pid`, read from /proc; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is the state (field 3 of proc(5)); utime, stime, cutime and cstime are fields 14 to 17
    return sum(int(tick) for tick in fields[11:15]) / os.sysconf("SC_CLK_TCK")
