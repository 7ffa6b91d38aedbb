"""Ctrl-C and SIGTERM (a cancelled CI job) during a run: the first stops the work, and the
reports are still written; a second one, while they are being written, must not cut them short.

Installed explicitly for the whole run, from the component check on: a process started in the
background by a non-interactive shell (or by a test runner) inherits SIGINT as ignored, and
Ctrl-C would then do nothing; SIGTERM would kill the runner without a report.
"""

from __future__ import annotations

import signal
import sys

SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOPPED = "interrupted (Ctrl-C or SIGTERM) before this suite finished"
"""The error of every test a signal left unfinished."""


class Interrupts:
    """While entered, the first SIGINT or SIGTERM raises KeyboardInterrupt; any later one, or any at
    all once `writing_reports` was called, only says that the reports are being written."""

    def __init__(self) -> None:
        self.count = 0
        self._writing = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Interrupts:
        self._previous = {signum: signal.signal(signum, self._handle) for signum in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        if self.interrupted:
            # The process is on its way out with 130. A late signal (the second of two quick Ctrl-C) must
            # not kill it before its output is flushed: Python's own handler, or the SIG_DFL that
            # interpreter shutdown puts back for it, would. An ignored signal stays ignored to the end.
            for signum in SIGNALS:
                signal.signal(signum, signal.SIG_IGN)
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    @property
    def interrupted(self) -> bool:
        return self.count > 0

    def writing_reports(self) -> None:
        """From now on a signal no longer stops anything: what is left is writing what ran."""
        self._writing = True

    def _handle(self, signum, frame) -> None:
        self.count += 1
        if self.count == 1 and not self._writing:
            raise KeyboardInterrupt
        print(
            f"torchmatrix: {signal.Signals(signum).name}: still writing the reports of what ran; they take seconds",
            file=sys.stderr,
            flush=True,
        )
