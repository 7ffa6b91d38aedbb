"""The short environment block of a reproducer's README: python, OS, CPU, GPU, CUDA, torch's build
and git version and the few packages a torch bug depends on, asked of the interpreter that ran
that torch. It takes a second, where `torch.utils.collect_env` (kept whole in collect_env.txt)
takes many and says more than a bug report reads."""

from __future__ import annotations

import json
import subprocess

PROBE_SECONDS = 120
PACKAGES = ("numpy", "triton", "pytest")
PACKAGE_PREFIXES = ("nvidia-cudnn", "nvidia-nccl")
PROBE = f"""
import json, os, platform
from importlib import metadata
facts = {{"python": platform.python_version(), "OS": platform.platform()}}
model = ""
try:
    with open("/proc/cpuinfo") as info:
        model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
except OSError:
    pass
facts["CPU"] = ", ".join(filter(None, [model, platform.machine(), f"{{os.cpu_count()}} logical cores"]))
try:
    import torch
    facts["torch"] = f"{{torch.__version__}}, git {{torch.version.git_version}}"
    facts["CUDA"] = torch.version.cuda or "none (a CPU build)"
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    facts["GPU"] = ", ".join(gpus) or "none visible"
except Exception as error:
    facts["torch"] = f"does not import: {{type(error).__name__}}: {{error}}"
names = {{(d.metadata["Name"] or "").lower(): d.version for d in metadata.distributions()}}
wanted = [n for n in sorted(names) if n in {PACKAGES!r} or n.startswith({PACKAGE_PREFIXES!r})]
facts["packages"] = ", ".join(f"{{n}} {{names[n]}}" for n in wanted) or "none of " + ", ".join({PACKAGES!r})
print(json.dumps(facts))
"""


def environment_lines(python: str | None) -> list[str]:
    """`key: value` lines describing `python`'s environment; one line saying why when it cannot be asked."""
    if python is None:
        return ["not asked: no interpreter of this torch here (pass --python or --writer-python)"]
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=PROBE_SECONDS)
        facts = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return ["not asked: its interpreter did not run the probe"]
    return [f"{key}: {value}" for key, value in facts.items()]
