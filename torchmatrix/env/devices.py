"""What the current environment can run on: its torch build and its accelerators.

The probe runs in a child interpreter so that the runner itself never imports torch, and so that
an environment whose torch is broken is reported instead of crashing the runner.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass

PROBE = """
import json
from importlib import metadata


def _release():
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""


try:
    import torch
except Exception as error:
    print(json.dumps({"error": f"{type(error).__name__}: {error}"}))
else:
    cuda = torch.cuda.is_available()
    print(json.dumps({
        "torch": torch.__version__,
        "git_version": getattr(torch.version, "git_version", ""),
        "cuda_version": torch.version.cuda,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "gpu_name": torch.cuda.get_device_name(0) if cuda else "",
        "release": _release(),
    }))
"""


class ProbeError(RuntimeError):
    """The environment has no usable torch; the message says what failed."""


@dataclass(frozen=True)
class Environment:
    """The torch build and accelerators of one virtualenv."""

    torch: str
    git_version: str
    cuda_version: str | None
    gpu_count: int
    gpu_name: str
    release: str = ""
    """The torch distribution pip installed (its metadata's version; "" for a torch not installed by pip)."""

    @property
    def device_type(self) -> str:
        return "cuda" if self.gpu_count else "cpu"

    @property
    def backend(self) -> str:
        """Collectives backend: nccl for GPU tensors (gloo kept for CPU-side collectives), else gloo."""
        return "cpu:gloo,cuda:nccl" if self.gpu_count else "gloo"

    @property
    def description(self) -> str:
        """How reports name the device, so nobody mistakes a CPU simulation for a GPU run."""
        if self.gpu_count:
            return f"cuda ({self.gpu_count}x {self.gpu_name}, CUDA {self.cuda_version})"
        return "cpu (ranks simulated as processes, gloo)"

    @property
    def base_version(self) -> str:
        """The release without the local build tag: 2.13.0+cpu -> 2.13.0."""
        return self.torch.split("+", 1)[0]

    def has_release(self, version: str) -> bool:
        """Whether this is torch `version`: its build says so, or the distribution pip installed
        does (a wheel whose build reports another number, as a bisect's stand-in releases do)."""
        return version == self.base_version or bool(self.release) and version == self.release.split("+", 1)[0]

    def to_json(self) -> dict:
        """What plans and reports record: the build, the device in words, and how ranks connect."""
        return {**asdict(self), "device": self.description, "device_type": self.device_type, "backend": self.backend}


def probe(python: str = sys.executable, timeout: float = 120.0) -> Environment:
    """Ask `python` which torch it has and which GPUs it sees."""
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ProbeError(f"importing torch with {python} took over {timeout:.0f}s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise ProbeError(
            f"{python} could not run the torch probe: {(done.stderr.strip().splitlines() or ['no output'])[-1]}"
        )
    found = json.loads(lines[-1])
    if "error" in found:
        raise ProbeError(f"torch is not importable with {python}: {found['error']}")
    return Environment(**found)
