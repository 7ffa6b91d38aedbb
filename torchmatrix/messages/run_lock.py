"""One runner per torch version directory: a second `run` with the same --run-id and torch
version would write every testcase twice, and `report` during a run would freeze a running cell
as lost. The runner holds an flock on a file in the version directory until it exits (the kernel
drops it even after SIGKILL); the file names the holder for the refusal message.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from torchmatrix.messages.run_tree import open_regular
from torchmatrix.user_error import UserError

LOCK_NAME = ".run.lock"


class RunBusy(UserError):
    """Another runner holds the version directory; the message names its pid."""


def lock_version_directory(version_dir: Path) -> int:
    """Take the version directory's lock; return its file descriptor, held until this process exits."""
    version_dir.mkdir(parents=True, exist_ok=True)
    fd = open_regular(version_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "pid unknown"
        os.close(fd)
        raise RunBusy(f"{version_dir} is being written by another run ({holder})") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}".encode())
    return fd


def running_holder(version_dir: Path) -> str | None:
    """Who is running in `version_dir` now (its lock is held), or None; ForeignEntry where the lock's
    name holds a pipe, which no runner made."""
    try:
        fd = open_regular(version_dir / LOCK_NAME)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 4096, 0).decode(errors="replace").strip() or "pid unknown"
    finally:
        os.close(fd)
    return None
