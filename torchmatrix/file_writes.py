"""How torchmatrix writes every file it writes: never through a symlink planted at its path.

A run directory can come from elsewhere (a CI artifact, a shared file system), so a report's name
in it may be a symlink to `~/.bashrc`. Whole files are written to a new temporary file in their
own directory and renamed over the name, which replaces a symlink instead of following it, and a
reader never sees half a file; files that grow while a run goes (logs, event logs) are opened with
O_NOFOLLOW, so a symlink at their name is an error, never a write elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

FILE_MODE = 0o644


@contextlib.contextmanager
def replacing(path: Path, mode: int = FILE_MODE) -> Iterator[Path]:
    """A fresh temporary path beside `path` for a writer that wants a file name; renamed over `path`
    with `mode` when the block ends, removed when it raises (the file it replaces stays whole)."""
    path = Path(path)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    os.close(fd)
    try:
        yield Path(temporary)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:  # a full disk, or Ctrl-C: nothing half-written stays
        Path(temporary).unlink(missing_ok=True)
        raise


def write_bytes(path: Path, data: bytes) -> Path:
    """Write `data` as the whole of `path` by temp file + rename; return `path`."""
    with replacing(path) as temporary:
        temporary.write_bytes(data)
    return Path(path)


def write_text(path: Path, text: str) -> Path:
    """Write `text` (UTF-8) as the whole of `path` by temp file + rename; return `path`."""
    return write_bytes(path, text.encode("utf-8"))


def copy_file(source: Path, path: Path) -> Path:
    """Copy `source` (never followed if a symlink) as the whole of `path` by temp file + rename, with
    its permission bits (a 0600 file stays private); also `shutil.copytree`'s `copy_function`."""
    with replacing(Path(path), stat.S_IMODE(os.lstat(source).st_mode)) as temporary:
        shutil.copyfile(source, temporary, follow_symlinks=False)
    return Path(path)


def open_stream(path: Path, mode: str = "w", **options):
    """`open(path, mode)` for a file written as it grows ("w", "a", "wb", "ab"), refusing to follow a
    symlink at `path` (OSError ELOOP)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    try:
        return os.fdopen(fd, mode, **options)
    except BaseException:
        os.close(fd)
        raise
