"""What pip or uv is doing while it installs a torch version, shown on the terminal.

The installer's full output goes to install.log; the terminal gets one line per torch version
(what is being downloaded or installed, MB done, elapsed), rewritten in place on a TTY and
printed every `interval` seconds (and at each change of phase) in a CI log. A timer keeps that
cadence while the installer is silent, as pip is for minutes while it unpacks torch.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

PIP_DOWNLOADING = re.compile(r"^\s*Downloading (\S+) \(([\d.]+) (kB|MB|GB)\)")
PIP_CACHED = re.compile(r"^\s*(?:Using cached (\S+) \(([\d.]+) (kB|MB|GB)\)|File was already downloaded (\S+))")
PIP_RAW_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")
PIP_INSTALLING = re.compile(r"^Installing collected packages: (.*)$")
UV_DOWNLOADING = re.compile(r"^\s*Downloading (\S+) \(([\d.]+)\s?(KiB|MiB|GiB)\)")
UV_DOWNLOADED = re.compile(r"^\s*Downloaded (\S+)")
UV_PREPARED = re.compile(r"^\s*Prepared (\d+) packages?")
REASON = re.compile(r"^(ERROR: .*|error: .*|\s*╰─▶ .*)$")
PIP_IGNORED_NOTE = "ERROR: Ignored the following versions"  # pip's note on what it skipped, before the real error
TTY_TICK_S = 1.0  # the elapsed time shows whole seconds
UNPACK_MEASURE_S = 5.0  # walking a torch venv (~10k files) takes a fraction of a second
NAMED_PACKAGES = 3
UNITS = {"kB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


@dataclass
class InstallProgress:
    """Folds installer output lines into a state that renders as one line."""

    label: str
    started: float = field(default_factory=time.monotonic)
    phase: str = "resolving"
    current: str = ""
    current_done: int = 0
    current_total: int = 0
    downloaded: int = 0
    downloads: int = 0
    cached: int = 0
    reason: str = ""
    venv: Path | None = None
    """The venv being installed into: while pip unpacks (minutes for torch, silently) the line says how much it wrote."""
    unpacked_from: int | None = None
    unpacked: int = 0
    measured_at: float = float("-inf")

    def feed(self, line: str) -> None:
        line = line.rstrip("\n")
        if match := PIP_RAW_PROGRESS.match(line):
            self.current_done, self.current_total = int(match[1]), int(match[2]) or self.current_total
            if self.current_total and self.current_done >= self.current_total:
                self._finish_download()
        elif match := PIP_DOWNLOADING.match(line) or UV_DOWNLOADING.match(line):
            if ".metadata" not in match[1]:
                self._finish_download()
                self.phase, self.current = "downloading", "-".join(match[1].split("-")[:2])
                self.current_done, self.current_total = 0, int(float(match[2]) * UNITS[match[3]])
        elif match := UV_DOWNLOADED.match(line):
            self.current_done = self.current_total
            self._finish_download()
        elif PIP_CACHED.match(line):
            self.cached += 1
        elif match := PIP_INSTALLING.match(line):
            self._finish_download()
            names = [name.strip() for name in match[1].split(",")]
            more = f", +{len(names) - NAMED_PACKAGES} more" if len(names) > NAMED_PACKAGES else ""
            self.phase = "installing"
            self.current = f"{len(names)} packages ({', '.join(names[:NAMED_PACKAGES])}{more})"
            self.current_done = self.current_total = 0
            self.unpacked_from = tree_bytes(self.venv) if self.venv else None
        elif match := UV_PREPARED.match(line):
            self._finish_download()
            self.phase, self.current = "installing", f"{match[1]} packages"
        elif match := REASON.match(line):
            if not self.reason or self.reason.startswith(PIP_IGNORED_NOTE):
                self.reason = match[1].strip().removeprefix("╰─▶ ")

    def _finish_download(self) -> None:
        if self.current and self.phase == "downloading":
            self.downloaded += self.current_done
            self.downloads += 1
            self.current, self.current_done, self.current_total = "", 0, 0

    def line(self, now: float | None = None) -> str:
        elapsed = int((now if now is not None else time.monotonic()) - self.started)
        parts = [f"{self.label}: {self.phase}"]
        if self.current:
            parts[0] += f" {self.current}"
            if self.current_total:
                parts[0] += f" {self.current_done / 1e6:.0f}/{self.current_total / 1e6:.0f} MB"
        if self.phase == "installing" and self.unpacked_from is not None:
            parts.append(f"{self.unpacked_so_far(now) / 1e6:.0f} MB unpacked into the venv")
        done = self.downloaded + (self.current_done if self.phase == "downloading" else 0)
        if done or self.downloads or self.cached:
            parts.append(f"{done / 1e6:.0f} MB downloaded ({self.downloads} files, {self.cached} from cache)")
        parts.append(f"{elapsed // 60}:{elapsed % 60:02d} elapsed")
        return " | ".join(parts)

    def unpacked_so_far(self, now: float | None = None) -> int:
        """Bytes the install has added to the venv, measured at most every UNPACK_MEASURE_S seconds."""
        now = time.monotonic() if now is None else now
        if self.venv and self.unpacked_from is not None and now - self.measured_at >= UNPACK_MEASURE_S:
            self.unpacked, self.measured_at = max(tree_bytes(self.venv) - self.unpacked_from, 0), now
        return self.unpacked


def tree_bytes(root: Path) -> int:
    """The bytes of every file under `root` (files vanishing meanwhile are skipped)."""
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                continue
    return total


class ProgressLine:
    """Writes an InstallProgress to a stream: rewritten in place on a TTY, periodic lines otherwise."""

    def __init__(self, progress: InstallProgress, stream: TextIO = sys.stderr, interval: float = 15.0):
        self.progress = progress
        self.stream = stream
        self.tty = stream.isatty()
        self.interval = 0.2 if self.tty else interval
        self.tick = TTY_TICK_S if self.tty else interval
        self.last_shown = float("-inf")
        self.last_phase = ""
        self.writing = threading.Lock()
        self.stopped = threading.Event()
        self.timer: threading.Thread | None = None

    def update(self, now: float | None = None) -> None:
        with self.writing:
            now = time.monotonic() if now is None else now
            changed = self.progress.phase != self.last_phase
            if not changed and now - self.last_shown < self.interval:
                return
            self.last_shown, self.last_phase = now, self.progress.phase
            self._write(self.progress.line(now))

    @contextmanager
    def ticking(self) -> Iterator[ProgressLine]:
        """Show the line at least every `tick` seconds while the block runs, output or not."""
        self.stopped.clear()
        self.timer = threading.Thread(target=self._tick, name="install-progress", daemon=True)
        self.timer.start()
        try:
            yield self
        finally:
            self._stop_ticking()

    def _tick(self) -> None:
        while not self.stopped.wait(max(self.last_shown + self.tick - time.monotonic(), 0.05)):
            self.update()

    def _stop_ticking(self) -> None:
        self.stopped.set()
        if self.timer is not None and self.timer is not threading.current_thread():
            self.timer.join()
        self.timer = None

    def close(self, outcome: str) -> None:
        self._stop_ticking()
        with self.writing:
            self._write(f"{self.progress.line()} | {outcome}")
            if self.tty:
                self.stream.write("\n")
                self.stream.flush()

    def _write(self, text: str) -> None:
        if self.tty:
            columns = shutil.get_terminal_size().columns - 1
            self.stream.write("\r" + text[:columns] + "\x1b[K")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
