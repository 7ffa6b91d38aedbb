"""A rank's resident high-water mark is read per test: each reading is the peak since the last one,
not the process's lifetime peak, which would carry every earlier test's."""

from __future__ import annotations

import subprocess
import sys

import pytest

from torchmatrix.messages.properties import PEAK_RSS_BYTES
from torchmatrix.ranks.memory_peaks import largest

MIB = 2**20

PROBE = """
from torchmatrix.messages.properties import PEAK_RSS_BYTES
from torchmatrix.ranks.memory_peaks import peaks_since_last_reading
peaks_since_last_reading()
held = bytearray(256 * 2**20)  # touched: resident, then given back (mmap'd: RSS falls)
del held
during = peaks_since_last_reading()
after = peaks_since_last_reading()
print(during.get(PEAK_RSS_BYTES, -1), after.get(PEAK_RSS_BYTES, -1))
"""


def test_each_reading_is_the_peak_since_the_last_one():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    during, after = map(int, done.stdout.split())
    if during == -1:
        pytest.skip("this kernel refuses /proc/self/clear_refs: the figure is left out, as the module says")
    assert during > 256 * MIB
    assert after < during - 200 * MIB, "the second reading still held the first one's peak"


def test_the_largest_rank_is_taken_per_figure():
    readings = [{PEAK_RSS_BYTES: 3 * MIB}, {PEAK_RSS_BYTES: 5 * MIB, "cuda_peak_allocated_bytes": 1}, {}]
    assert largest(readings) == {PEAK_RSS_BYTES: 5 * MIB, "cuda_peak_allocated_bytes": 1}
