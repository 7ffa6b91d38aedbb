"""The names of the figures a test leaves in its JUnit report: the ranks' side writes them and the
reports read them, so both take them from here, as pytest keeps its report's types in one place."""

from __future__ import annotations

CPU_SECONDS = "cpu_seconds"  # a test's CPU time, on every rank and in pytest
WARNING_PROPERTY = "warning"  # warning.1, warning.2, ...: one JSON entry per distinct warning of a test
COMPILE_SECONDS = "compile_seconds"  # the slowest rank's seconds in torch.compile
COMPILE_SECONDS_SAVED = "compile_seconds_saved"  # what a warm compile store saved, beside compile_seconds

PEAK_RSS_BYTES = "peak_rss_bytes"  # the ranks' largest resident high-water mark
CUDA_PEAK_ALLOCATED_BYTES = "cuda_peak_allocated_bytes"  # torch.cuda.max_memory_allocated, largest rank
CUDA_PEAK_RESERVED_BYTES = "cuda_peak_reserved_bytes"  # torch.cuda.max_memory_reserved, largest rank
MEMORY_PEAKS = (PEAK_RSS_BYTES, CUDA_PEAK_ALLOCATED_BYTES, CUDA_PEAK_RESERVED_BYTES)
STEP_PEAK = "step_peak_bytes"  # the peak_memory suite's figure; `step_peak_bytes/<kind>` per kind of tensor

CONFIRMATION_PROPERTY = "torchmatrix.confirmation"
CONFIRMATION_NOTE_PROPERTY = "torchmatrix.confirmation_note"


def confirmation_property(suite: str, test: str) -> str:
    """The testsuite property that says what re-running a failed test alone showed."""
    return f"{CONFIRMATION_PROPERTY}::{suite}::{test}"


def confirmation_note_property(suite: str, test: str) -> str:
    """The testsuite property that holds a confirmed failure's note: the re-run's result, or why there was none."""
    return f"{CONFIRMATION_NOTE_PROPERTY}::{suite}::{test}"
