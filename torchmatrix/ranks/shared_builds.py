"""What Inductor builds from source alone (the ISA probe, the kernels), built once where every rank
of a cell would build it again: such a file is named by a hash of its source and compile command, so
sharing it shares no graph, and the guarded graph caches stay in each rank's folder
(docs/explanation/compile.md, "What Inductor builds from source alone is shared")."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
from dataclasses import dataclass

from torchmatrix.ranks.truncated_builds import rebuild_truncated


@dataclass
class _Places:
    """Where this process's shared builds go: set per cell by `place`, read at each build."""

    cache_variable: str = ""
    probe: str | None = None
    kernels: str | None = None


_places = _Places()
_swap = threading.RLock()  # one redirection at a time; a build inside another's keeps the outer folder
_redirected = False


def place(*, probe: str, kernels: str) -> None:
    """From now on this process builds the ISA probe in `probe` and its kernels in `kernels`."""
    _places.probe, _places.kernels = probe, kernels


def share_inductor_builds(cache_variable: str) -> None:
    """Make Inductor build its ISA probe in the probe folder, and write its source-addressed files
    (kernel sources, the libraries built beside them) and take their build locks in the kernels
    folder; the rest of its cache stays where `cache_variable` says. A torch without one of these
    hooks keeps that build in the rank's folder."""
    _places.cache_variable = cache_variable
    try:
        from torch._inductor import codecache, cpu_vec_isa
    except ImportError:
        return
    probe = getattr(cpu_vec_isa, "valid_vec_isa_list", None)
    if probe is not None:
        cpu_vec_isa.valid_vec_isa_list = functools.cache(_built_in(lambda *_: _places.probe, probe))
    rebuild_truncated(codecache)
    write, lock_dir = getattr(codecache, "write", None), getattr(codecache, "get_lock_dir", None)
    if write is not None and lock_dir is not None:
        codecache.write = _built_in(_source_addressed(write), write)
        codecache.get_lock_dir = _built_in(lambda *_: _places.kernels, lock_dir)


def _source_addressed(write):
    """The kernels folder for a `write` that names its file by the content's hash; None for one
    given its key or folder (a compiled graph's file, named by its guarded cache key)."""
    signature = inspect.signature(write)

    def folder(args, kwargs):
        call = signature.bind_partial(*args, **kwargs).arguments
        return None if call.get("key") or call.get("specified_dir") else _places.kernels

    return folder


def _built_in(folder_for, fn):
    """fn, run with Inductor's cache variable naming `folder_for(args, kwargs)` (None: unchanged)."""

    @functools.wraps(fn)
    def in_shared_folder(*args, **kwargs):
        global _redirected
        folder = folder_for(args, kwargs)
        with _swap:
            if folder is None or _redirected:
                return fn(*args, **kwargs)
            _redirected = True
            try:
                with cache_in(_places.cache_variable, folder):
                    return fn(*args, **kwargs)
            finally:
                _redirected = False

    return in_shared_folder


@contextlib.contextmanager
def cache_in(variable: str, folder: str):
    """Inductor's cache variable `variable` naming `folder` for the block, then as it was (unset included)."""
    own = os.environ.get(variable)
    os.environ[variable] = folder
    try:
        yield
    finally:
        if own is None:
            del os.environ[variable]
        else:
            os.environ[variable] = own
