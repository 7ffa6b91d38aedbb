"""The memory a rank held at its highest during each test: its resident set's high-water mark and, on
a GPU, the caching allocator's peaks, each reset when read so that the next reading is the next test's.

Linux resets a process's high-water mark (VmHWM) to its current resident size when "5" is written to
/proc/self/clear_refs; where that write is refused the figure is left out rather than reported as the
rank's lifetime peak, which would carry every earlier test's.
"""

from __future__ import annotations

import os
import sys

from torchmatrix.messages.properties import (
    CUDA_PEAK_ALLOCATED_BYTES,
    CUDA_PEAK_RESERVED_BYTES,
    PEAK_RSS_BYTES,
)

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"
_RESET_PEAK = b"5"


def peaks_since_last_reading() -> dict[str, int]:
    """This process's peaks since the previous call (or since it started), then reset: the resident
    high-water mark where Linux can reset it, and CUDA's allocator peaks where this rank uses CUDA."""
    peaks = {}
    resident = _resident_high_water()
    if resident is not None and _reset_resident_high_water():
        peaks[PEAK_RSS_BYTES] = resident
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        device = torch.cuda.current_device()
        peaks[CUDA_PEAK_ALLOCATED_BYTES] = torch.cuda.max_memory_allocated(device)
        peaks[CUDA_PEAK_RESERVED_BYTES] = torch.cuda.max_memory_reserved(device)
        torch.cuda.reset_peak_memory_stats(device)
    return peaks


def largest(readings: list[dict[str, int]]) -> dict[str, int]:
    """Each peak's largest value over the ranks that reported it."""
    found: dict[str, int] = {}
    for reading in readings:
        for name, value in reading.items():
            found[name] = max(found.get(name, 0), value)
    return found


def _resident_high_water() -> int | None:
    try:
        with open(_STATUS) as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_resident_high_water() -> bool:
    """A write to the kernel's control file, never a file created: no O_CREAT."""
    try:
        control = os.open(_CLEAR_REFS, os.O_WRONLY)
    except OSError:
        return False
    try:
        os.write(control, _RESET_PEAK)
    except OSError:
        return False
    finally:
        os.close(control)
    return True
