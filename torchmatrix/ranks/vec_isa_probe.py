"""Inductor's CPU vector-ISA probe, built once per torch version's run instead of once per rank process.

Before its first CPU kernel a process asks Inductor which vector ISAs (AVX2, AVX-512, ...) it may
use; Inductor answers by compiling a probe library per candidate ISA in the compile cache current
at that moment and loading each in a child interpreter (torch/_inductor/cpu_vec_isa.py). With a
cache folder per cell and rank (`worker.in_compile_cache`) every rank process that compiled built
the probes afresh: about 8 CPU seconds, against about 1 where their build is already in the folder.
"""

from __future__ import annotations

import functools
import os

PROBE_FOLDER = ".vec-isa-probe"  # beside the cells' folders; a cell id starts with its world size, never a dot


def share_vec_isa_probe(cache_variable: str) -> None:
    """Make this process's ISA probe build in the run's shared probe folder: `PROBE_FOLDER` beside the
    cell folder that `cache_variable` names at the time of the probe (`<root>/<cell id>/rank<N>`).

    The probe's answer depends on the CPU, the compiler and torch, never on a cell, so sharing its
    build shares no kernel. A torch whose Inductor has no such probe is left as it is."""
    try:
        from torch._inductor import cpu_vec_isa
    except ImportError:
        return
    probe = getattr(cpu_vec_isa, "valid_vec_isa_list", None)
    if probe is None:
        return

    @functools.cache
    def probed_in_shared_folder():
        cell_rank_folder = os.environ.get(cache_variable)
        if not cell_rank_folder:
            return probe()
        shared = os.path.join(os.path.dirname(os.path.dirname(cell_rank_folder)), PROBE_FOLDER)
        os.environ[cache_variable] = shared
        try:
            return probe()
        finally:
            os.environ[cache_variable] = cell_rank_folder

    cpu_vec_isa.valid_vec_isa_list = probed_in_shared_folder
