"""What a run directory may hold: its own folders and regular files, never a link or a pipe.

A run directory can come from elsewhere (a CI artifact, an unpacked tarball, a shared file
system), so a folder in it may be a symlink to a directory outside, and a file a named pipe. A
runner that clears `torch-V/reads/` would then delete the link's target, a merge would copy it,
and a reader would wait on the pipe forever; each place that deletes, copies or reads checks here
first and refuses with one line.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from torchmatrix.user_error import UserError

REMEDY = "replace it with a copy of what it points to (cp -rL), or remove it"


class ForeignEntry(UserError, ValueError):
    """A run directory's entry that leads out of it (a symlink) or is no file to read (a pipe, a device)."""


def refuse_linked_folders(run_dir: Path, folders: Iterable[Path]) -> None:
    """Raise ForeignEntry where one of `folders` (inside `run_dir`), or a folder between it and
    `run_dir`, is a symlink: what is deleted or written there would land in the link's target."""
    for folder in folders:
        parts = Path(folder).relative_to(run_dir).parts
        for depth in range(1, len(parts) + 1):
            path = run_dir.joinpath(*parts[:depth])
            if path.is_symlink():
                raise ForeignEntry(f"{path} is a symlink to {os.readlink(path)}, not a folder of the run; {REMEDY}")


def refuse_foreign_entries(root: Path) -> None:
    """Raise ForeignEntry where `root` or anything under it is a symlink, or neither a folder nor a
    regular file, so copying the tree copies only what the run directory itself holds."""
    refuse_linked_folders(root.parent, [root])
    for directory, folders, files in os.walk(root):
        for name in sorted(folders + files):
            refuse_foreign_file(Path(directory) / name, folder_too=True)


def refuse_foreign_file(path: Path, *, folder_too: bool = False) -> None:
    """Raise ForeignEntry where `path` is a symlink, or not a regular file (nor, with `folder_too`, a folder)."""
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode):
        raise ForeignEntry(f"{path} is a symlink to {os.readlink(path)}, not a file of the run; {REMEDY}")
    if not (stat.S_ISREG(mode) or (folder_too and stat.S_ISDIR(mode))):
        raise ForeignEntry(f"{path} is {_kind(mode)}, not a file of the run; remove it, or rerun that torch version")


def _kind(mode: int) -> str:
    """What a non-regular entry is, in words."""
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a socket or device"


def open_regular(path: Path, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """`os.open(path, flags)` that never waits on a named pipe at `path` nor follows a symlink there:
    raise ForeignEntry where `path` is no regular file (OSError where it cannot be opened at all)."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW, mode)
    try:
        found = os.fstat(fd).st_mode
        if not stat.S_ISREG(found):
            raise ForeignEntry(
                f"{path} is {_kind(found)}, not a file of the run; remove it, or rerun that torch version"
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_text(path: Path) -> str:
    """The UTF-8 text of a run directory's file, refusing (ForeignEntry) a pipe or device at `path`."""
    with os.fdopen(open_regular(path), encoding="utf-8") as file:
        return file.read()
