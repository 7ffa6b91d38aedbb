"""One matrix run per nox envdir at a time: two `nox -s gpu_matrix` in one checkout share its venvs,
and the second would recreate (or reinstall into) the venv the first is running its cells from.

The lock is an flock on a file in the envdir (`.nox/` unless `--envdir` says otherwise), held by
the nox process until it exits (the kernel drops it even after SIGKILL); the file names the
holder's pid for the refusal message. Runs with separate envdirs do not share venvs and run freely.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

MATRIX_SESSIONS = ("gpu_matrix", "hf_matrix")
SELECTING_OPTIONS = ("-s", "--session", "--sessions", "-e", "-k", "-t", "--tags")
LISTING_OPTIONS = ("-l", "--list", "--list-sessions", "--json", "--usage")
LOCK_NAME = "torchmatrix-matrix.lock"


class EnvdirBusy(Exception):
    """Another matrix run holds this envdir's venvs; the message names its pid."""


def runs_matrix_sessions(argv: list[str]) -> bool:
    """Whether this nox command line runs matrix sessions: it names one, or selects none (all run)."""
    options = {arg.split("=", 1)[0] for arg in argv}
    if options & set(LISTING_OPTIONS):
        return False
    if any(session in arg for arg in argv for session in MATRIX_SESSIONS):
        return True
    return not options & set(SELECTING_OPTIONS)


def envdir_of(argv: list[str], noxfile_dir: Path) -> Path:
    """The envdir nox will use: `--envdir DIR` (relative to the noxfile, as nox takes it) or `.nox`."""
    envdir = ".nox"
    for index, arg in enumerate(argv):
        if arg == "--envdir" and index + 1 < len(argv):
            envdir = argv[index + 1]
        elif arg.startswith("--envdir="):
            envdir = arg.split("=", 1)[1]
    return noxfile_dir / envdir


def lock_envdir(envdir: Path) -> int:
    """Take the matrix lock of `envdir`; return its file descriptor, to be held until the process
    exits; raise EnvdirBusy naming the pid that holds it."""
    envdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(envdir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "pid unknown"
        os.close(fd)
        raise EnvdirBusy(
            f"another matrix run ({holder}) is using the venvs in {envdir}; wait for it to finish, or give this one its own --envdir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
    return fd
