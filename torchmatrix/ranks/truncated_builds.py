"""A kernel library a killed rank left half-written is built again, never loaded.

Inductor compiles a kernel straight to its final path in the cell's shared kernels folder, and
builds only when that path is missing: a rank killed while linking leaves a 0-byte or truncated
`.so` that every later test of the cell would load ("file too short"). Before each build, under
the build's own lock, a target that is not a whole ELF file is removed so the build runs again.
"""

from __future__ import annotations

import functools
import os
import struct

ELF_MAGIC = b"\x7fELF"


def rebuild_truncated(codecache) -> None:
    """Make Inductor's C++ build step remove a truncated target before it decides whether to build."""
    worker = getattr(codecache, "_worker_compile_cpp", None)
    if worker is None or getattr(worker, "removes_truncated", False):
        return

    @functools.wraps(worker)
    def compile_whole(lock_path, cpp_builders):
        from torch.utils._filelock import FileLock

        with FileLock(lock_path, timeout=getattr(codecache, "LOCK_TIMEOUT", 600)):
            for builder in cpp_builders:
                target = builder.get_target_file_path()
                if os.path.exists(target) and not is_whole_elf(target):
                    os.remove(target)
        return worker(lock_path, cpp_builders)

    compile_whole.removes_truncated = True
    codecache._worker_compile_cpp = compile_whole


def is_whole_elf(path: str) -> bool:
    """Whether `path` is an ELF file as long as its header says: the section header table, which a
    linker writes last, ends inside it. A file of another format counts as whole (not ours to judge)."""
    try:
        with open(path, "rb") as file:
            header = file.read(64)
            size = os.fstat(file.fileno()).st_size
    except OSError:
        return False
    if len(header) < 4:
        return False
    if header[:4] != ELF_MAGIC:
        return True
    if len(header) < 52:
        return False
    wide, order = header[4] == 2, "<" if header[5] == 1 else ">"
    if wide and len(header) < 64:
        return False
    offset, entry_size, entries = (
        (struct.unpack_from(order + "Q", header, 40)[0], *struct.unpack_from(order + "HH", header, 58))
        if wide
        else (struct.unpack_from(order + "I", header, 32)[0], *struct.unpack_from(order + "HH", header, 46))
    )
    return size >= offset + entry_size * entries
