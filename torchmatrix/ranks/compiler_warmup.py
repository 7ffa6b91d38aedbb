"""What every rank's first torch.compile would repeat (importing Dynamo and Inductor, hashing
sources into cache keys, Inductor's ISA probe), done once in the process the zygote forks ranks from,
without starting a thread or touching CUDA (docs/explanation/compile.md says what it saves)."""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path

from torchmatrix.ranks import shared_builds

COMPILER_MODULES = ("torch._dynamo", "torch._inductor.compile_fx", "torch._functorch.aot_autograd")


def warm_up(probe_folder: Path, *, cache_variable: str, device_type: str, inductor: bool) -> None:
    """Import the compiler and, for `inductor`, compute its source keys and run its ISA probe, with its
    cache in `probe_folder` (where the ranks' probe goes, torchmatrix.ranks.shared_builds) and this
    process's own left as it was; other backends (aot_eager) use neither. Triton's key only on a CPU
    run: importing a GPU backend's compiler before the ranks fork is not proven free of CUDA. A torch
    without one of these leaves it to the ranks."""
    with shared_builds.cache_in(cache_variable, str(probe_folder)):
        for name in COMPILER_MODULES:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
        if not inductor:
            return
        try:
            from torch._inductor import codecache, cpu_vec_isa
        except ImportError:
            return
        keys = [getattr(codecache, "torch_key", None)]
        if device_type == "cpu":
            keys.append(getattr(codecache, "triton_key", None))
        for key in filter(None, keys):
            key()
        probe = getattr(cpu_vec_isa, "valid_vec_isa_list", None)
        if probe is not None:
            probe()
