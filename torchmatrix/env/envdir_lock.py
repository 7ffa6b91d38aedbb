"""Matrix runs that share a nox envdir must not install into a venv another one is running from.

A run that installs (the default, and `--install-only`) takes the envdir's lock exclusively: it
may recreate or reinstall the venvs. A run that only reuses them (`-R`, or `--no-install` with
`-r`/`--reuse-venv=yes`, as the Slurm array tasks do after their setup job) takes it shared: any
number of those run side by side, and an installing run is refused while one of them holds it.

The lock is an flock on a file in the envdir (`.nox/` unless `--envdir` says otherwise), held by
the nox process until it exits (the kernel drops it even after SIGKILL); the file lists the
holders (pid, host, mode) for the refusal message. Runs with separate envdirs run freely. Where
the file system has no flock (some NFS mounts), the run goes on unlocked with a warning.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MATRIX_SESSIONS = ("gpu_matrix", "hf_matrix")
SESSION_OPTIONS = ("-s", "-e", "--session", "--sessions")
KEYWORD_OPTIONS = ("-k", "--keywords")
TAG_OPTIONS = ("-t", "--tags")
LISTING_OPTIONS = ("-l", "--list", "--list-sessions", "--json", "--usage")
REUSE_OPTIONS = ("-r", "--reuse-existing-virtualenvs")
NO_REUSE_OPTIONS = ("-N", "--no-reuse-existing-virtualenvs")
LOCK_NAME = "torchmatrix-matrix.lock"


class EnvdirBusy(Exception):
    """Another matrix run holds this envdir's venvs in a conflicting mode; the message names its pid."""


class EnvdirUnlockable(Exception):
    """The envdir's file system refuses the lock (no flock on some NFS mounts); the message says which."""


@dataclass(frozen=True)
class MatrixSession:
    """What nox's `-s`, `-k` and `-t` match a matrix session by: its name, signatures and tags."""

    name: str
    signatures: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()

    @classmethod
    def parametrized(cls, name: str, versions: Iterable[str], tags: Iterable[str] = ()) -> MatrixSession:
        """A session parametrized over torch versions, with the signatures nox gives it: `name(torch='V')`."""
        return cls(name, tuple(f"{name}(torch={version!r})" for version in versions), tuple(tags))


def _values(argv: list[str], options: tuple[str, ...]) -> list[str] | None:
    """The values given to `options` (`-k EXPR`, `--tags=a`, `-s a b`), up to the next option or
    `--`; None when none of them appears."""
    values = None
    taking = False
    for arg in _nox_options(argv):
        name, equals, value = arg.partition("=")
        if name in options:
            values = values or []
            taking = not equals
            if equals:
                values.append(value)
        elif arg.startswith("-"):
            taking = False
        elif taking:
            values.append(arg)
    return values


def runs_matrix_sessions(argv: list[str], sessions: Iterable[MatrixSession] | None = None) -> bool:
    """Whether this nox command line runs a matrix session, selecting as nox does: `-k` and `-t`
    (then `-s` is ignored) or `-s`, or none (all run)."""
    sessions = list(sessions) if sessions is not None else [MatrixSession(name) for name in MATRIX_SESSIONS]
    options = {arg.split("=", 1)[0] for arg in _nox_options(argv)}
    if options & set(LISTING_OPTIONS):
        return False
    keywords, tags, named = _values(argv, KEYWORD_OPTIONS), _values(argv, TAG_OPTIONS), _values(argv, SESSION_OPTIONS)
    if keywords:
        from nox.manifest import keyword_match  # nox's own -k semantics; only a nox command line has -k
    for session in sessions:
        if keywords is None and tags is None:
            if named is None or any(session.name in text for text in named):
                return True
            continue
        if tags is not None and not set(session.tags) & set(tags):
            continue
        try:
            if not keywords or keyword_match(keywords[-1], [*session.signatures, *session.tags, session.name]):
                return True
        except Exception:  # nox refuses a malformed expression itself; lock rather than guess
            return True
    return False


def reuses_venvs_only(argv: list[str]) -> bool:
    """Whether nox will neither recreate nor install into a venv that exists: `-R`, or
    `--no-install` with venv reuse switched on (the last reuse option wins, as in nox)."""
    reuse = no_install = False
    options = _nox_options(argv)
    for index, arg in enumerate(options):
        name, equals, value = arg.partition("=")
        if arg == "-R":
            reuse = no_install = True
        elif arg == "--no-install":
            no_install = True
        elif arg in REUSE_OPTIONS:
            reuse = True
        elif arg in NO_REUSE_OPTIONS:
            reuse = False
        elif name == "--reuse-venv":
            value = value if equals else (options[index + 1] if index + 1 < len(options) else "")
            reuse = value in ("yes", "always")
    return reuse and no_install


def _nox_options(argv: list[str]) -> list[str]:
    """nox's own arguments: those before `--` (after it come the session's)."""
    return argv[: argv.index("--")] if "--" in argv else argv


def envdir_of(argv: list[str], noxfile_dir: Path) -> Path:
    """The envdir nox will use: `--envdir DIR` (relative to the noxfile, as nox takes it) or `.nox`."""
    envdir = ".nox"
    for index, arg in enumerate(argv):
        if arg == "--envdir" and index + 1 < len(argv):
            envdir = argv[index + 1]
        elif arg.startswith("--envdir="):
            envdir = arg.split("=", 1)[1]
    return noxfile_dir / envdir


def lock_envdir(envdir: Path, *, shared: bool = False) -> int:
    """Take the matrix lock of `envdir` (shared for a run that only reuses venvs); return its file
    descriptor, to be held until the process exits. Raise EnvdirBusy naming the holders that
    conflict, EnvdirUnlockable where the file system cannot lock."""
    path = envdir / LOCK_NAME
    try:
        envdir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        raise EnvdirUnlockable(f"cannot open the matrix lock {path}: {error.strerror}") from None
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        holders = _live_holders(os.pread(fd, 4096, 0).decode(errors="replace")) or "pid unknown"
        os.close(fd)
        wanted = "reuse" if shared else "install into"
        raise EnvdirBusy(
            f"another matrix run ({holders}) is using the venvs in {envdir}, and this one would {wanted} them; "
            "wait for it to finish, or give this one its own --envdir"
        ) from None
    except OSError as error:
        os.close(fd)
        raise EnvdirUnlockable(
            f"the file system of {envdir} cannot lock {LOCK_NAME} ({error.strerror}; NFS without flock?)"
        ) from None
    if not shared:
        os.ftruncate(fd, 0)
    mode = "reusing" if shared else "installing"
    os.write(
        fd,
        f"pid {os.getpid()} on {socket.gethostname()}, {mode}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(),
    )
    return fd


def _live_holders(text: str) -> str:
    """The holders the lock file lists, less those on this host whose process is gone (a shared
    holder's line stays until the next installing run rewrites the file)."""
    here = socket.gethostname()
    live = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 4 and words[0] == "pid" and words[2] == "on" and words[3].rstrip(",") == here:
            try:
                os.kill(int(words[1]), 0)
            except ProcessLookupError:
                continue
            except (PermissionError, ValueError):
                pass
        live.append(line.strip())
    return "; ".join(live)
