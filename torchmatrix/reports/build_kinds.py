"""Which kind of torch build each side of an upgrade diff ran (CPU, CUDA 12.8, ROCm 6.2), and what
comparing two kinds can and cannot explain.

`2.13.0+cpu` against `2.14.1+cu130` is two changes at once: the release and the build. On CPU
ranks both builds run CPU kernels built from the same source, so the build explains time and
warnings, not a result; on GPUs another CUDA brings other cuBLAS, cuDNN and NCCL kernels, so it
explains drift and time too, but still no failed load or missing state. Either way each build maps
libraries of its own size into every process, so the processes' resident peaks do not compare.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torchmatrix.json_records import JsonRecord
from torchmatrix.messages.properties import PEAK_RSS_BYTES
from torchmatrix.reports.records import VersionInfo

LOCAL_TAG = re.compile(r"\+(cpu|cu(\d+)|rocm([\d.]+))\b")
UNCOMPARED_PEAKS = (PEAK_RSS_BYTES,)  # what a build holds resident: its libraries' size, not the training's
RESIDENT_PEAKS_NOT_COMPARED = (
    " The processes' resident peaks (`peak_rss_bytes`) are not compared: each build maps libraries of its own size "
    "into every process; the training step's bytes by kind of tensor still are."
)


def build_kind(version: VersionInfo) -> str:
    """`CPU`, `CUDA 13.0`, `ROCm 6.2`, or "" when neither the build's local tag nor its CUDA version says."""
    build, cuda_version = version.environment.torch, version.environment.cuda_version
    tag = LOCAL_TAG.search(build)
    if tag and tag.group(1) == "cpu":
        return "CPU"
    if tag and tag.group(2):
        digits = tag.group(2)
        return f"CUDA {digits[:-1]}.{digits[-1]}"
    if tag and tag.group(3):
        return f"ROCm {tag.group(3)}"
    if cuda_version:
        return f"CUDA {cuda_version}"
    return "CPU" if build else ""


@dataclass(frozen=True)
class BuildMismatch(JsonRecord):
    """Baseline and candidate builds of different kinds, and where the run's ranks ran."""

    before: str
    after: str
    on_gpus: bool

    @property
    def note(self) -> str:
        """The mismatch, then what it can and cannot explain, in plain words."""
        pair = f"the baseline is a {self.before} build, the candidate a {self.after} build"
        return f"Different builds: {pair}. {self._what_it_explains}{RESIDENT_PEAKS_NOT_COMPARED}"

    @property
    def _what_it_explains(self) -> str:
        if not self.on_gpus:
            return (
                "The ranks ran on CPU, where both run CPU kernels built from the same "
                "source: the build can explain time (a CUDA build loads larger libraries into every process) and "
                "warnings about CUDA or NCCL, not a failure, drift, or a checkpoint that does not load; those are "
                "the release's. For timings that compare releases alone, install the same kind of build for both "
                "(docs: choose how torch installs)."
            )
        if "CPU" in (self.before, self.after):
            return (
                "A CPU build cannot use the GPUs, so its cells ran other code than the "
                "other side's: only what runs on CPU (checkpoint loads, CPU cells) compares; install the same kind "
                "of build for both (docs: choose how torch installs)."
            )
        return (
            "Other CUDA versions bring other cuBLAS, cuDNN and NCCL kernels and reduction "
            "orders: they can explain grown drift, slowdowns and new CUDA warnings; they cannot explain a failed "
            "checkpoint load or optimizer state that is missing or not a DTensor, which are torch's own code. "
            "Compare builds of one CUDA version to tell the release from the toolkit."
        )


def build_mismatch(before: VersionInfo, after: VersionInfo) -> BuildMismatch | None:
    """The mismatch of two versions' builds; None when they are of one kind or either is unknown."""
    kinds = build_kind(before), build_kind(after)
    if not all(kinds) or kinds[0] == kinds[1]:
        return None
    on_gpus = any(v.environment.gpu_count for v in (before, after))
    return BuildMismatch(*kinds, on_gpus)
