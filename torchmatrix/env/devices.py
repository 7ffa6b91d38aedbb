"""What the current environment can run on: its torch build and its accelerators.

The probe runs in a child interpreter so that the runner itself never imports torch, and so that
an environment whose torch is broken is reported instead of crashing the runner.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass, field, replace
from importlib import metadata

from torchmatrix import json_records
from torchmatrix.matrix.channels import channel_of, is_build_of

_GPU_DESCRIPTION = re.compile(r"cuda \((?P<count>\d+)x (?P<name>.*), CUDA (?P<cuda>.*)\)")
"""`Environment.description` of GPUs, read back by `Environment.recorded`."""

PROBE = "import json; from torchmatrix.env.devices import torch_facts; print(json.dumps(torch_facts()))"


def torch_facts() -> dict:
    """In the environment asked about: its torch build and GPUs, or {"error": why torch does not import}."""
    try:
        release = metadata.version("torch")
    except metadata.PackageNotFoundError:
        release = ""
    try:
        import torch
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"}
    cuda = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "git_version": getattr(torch.version, "git_version", ""),
        "cuda_version": torch.version.cuda,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "gpu_name": torch.cuda.get_device_name(0) if cuda else "",
        "release": release,
    }


class ProbeError(RuntimeError):
    """The environment has no usable torch; the message says what failed."""


@dataclass(frozen=True)
class Environment:
    """The torch build and accelerators of one virtualenv, from the probe to every plan and report."""

    torch: str = ""
    git_version: str = ""
    cuda_version: str | None = None
    gpu_count: int = 0
    gpu_name: str = field(
        default="",
        metadata=json_records.json_field(
            then={
                "device": lambda environment: environment.description,
                "device_type": lambda environment: environment.device_type,
                "backend": lambda environment: environment.backend,
            }
        ),
    )
    python: str = field(default="", metadata=json_records.json_field(omit_empty=True))
    """The interpreter that runs the cells; "" where they cannot run here."""
    no_torch: str = field(default="", metadata=json_records.json_field(omit_empty=True))
    """How reports name the device of an environment without a usable torch (`none (torch did not install)`)."""
    release: str = field(default="", metadata=json_records.json_field(omit_empty=True))
    """The torch distribution pip installed (its metadata's version; "" for a torch not installed by pip)."""

    @classmethod
    def without_torch(cls, device: str) -> Environment:
        """An environment whose cells cannot run, named in reports by `device`."""
        return cls(no_torch=device)

    @classmethod
    def recorded(cls, build: str, git_version: str = "", cuda_version: str = "", device: str = "") -> Environment:
        """The environment a report wrote in words (JUnit's properties, results.json's keys), its GPUs
        read back from the device's words; nothing recorded reads as `Environment()`, which names no device."""
        if not build:
            return cls.without_torch(device) if device else cls()
        gpus = _GPU_DESCRIPTION.fullmatch(device)
        if gpus is None:
            return cls(build, git_version, cuda_version or None)
        return cls(build, git_version, cuda_version or gpus["cuda"], int(gpus["count"]), gpus["name"])

    def running(self, python: str) -> Environment:
        """This environment, with `python` to run its cells."""
        return replace(self, python=python)

    @property
    def device_type(self) -> str:
        """`cuda` or `cpu`; "" without a usable torch."""
        if self.no_torch:
            return ""
        return "cuda" if self.gpu_count else "cpu"

    @property
    def backend(self) -> str:
        """Collectives backend: nccl for GPU tensors (gloo kept for CPU-side collectives), else gloo."""
        return "cpu:gloo,cuda:nccl" if self.gpu_count else "gloo"

    @property
    def description(self) -> str:
        """How reports name the device, so nobody mistakes a CPU simulation for a GPU run; "" where
        nothing was recorded."""
        if self.no_torch:
            return self.no_torch
        if not self.torch:
            return ""
        if self.gpu_count:
            return f"cuda ({self.gpu_count}x {self.gpu_name}, CUDA {self.cuda_version})"
        return "cpu (ranks simulated as processes, gloo)"

    @property
    def base_version(self) -> str:
        """The release without the local build tag: 2.13.0+cpu -> 2.13.0."""
        return self.torch.split("+", 1)[0]

    def has_release(self, version: str) -> bool:
        """Whether this is torch `version`: its build says so, or the distribution pip installed
        does (a wheel whose build reports another number, as a bisect's stand-in releases do); a
        channel value, whether this build is one it resolves to."""
        if channel_of(version):
            return is_build_of(version, self.release or self.torch)
        return version == self.base_version or bool(self.release) and version == self.release.split("+", 1)[0]

    def to_json(self) -> dict:
        """What plans and reports record: the build, the device in words, how ranks connect, and the
        interpreter where cells run; only the device's words without a usable torch."""
        return {"device": self.no_torch} if self.no_torch else json_records.to_json(self)

    @classmethod
    def from_json(cls, data: dict) -> Environment:
        """The environment a plan recorded (`to_json`'s keys); one without a torch build reads as
        one without a usable torch, named by its recorded device. Values of the wrong kind read as
        absent: a plan.json may come from another machine."""
        if not isinstance(data.get("torch"), str) or not data["torch"]:
            device = data.get("device")
            return cls.without_torch(device if isinstance(device, str) and device else "unknown")
        return json_records.from_json(cls, data, forgiving=True)


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
    return environment_of(json.loads(lines[-1]), python)


def environment_of(facts: dict, python: str) -> Environment:
    """The environment `torch_facts` described in `python`; ProbeError where its torch does not import."""
    if "error" in facts:
        raise ProbeError(f"torch is not importable with {python}: {facts['error']}")
    return Environment(**facts)
