"""What each rank's first torch.compile repeated, done once in the process the zygote forks ranks from.

A fresh rank's first compile imported Dynamo and Inductor, hashed torch's and Triton's sources into
its cache keys, and ran Inductor's vector-ISA probe, which dlopens a test library in a child
interpreter for each ISA; the pool forks fresh ranks for every pytest process and after every
failed test, so the modern-stack cell's ranks did it 24 times a run (six pool starts of four).
Done here, before the zygote forks, every rank inherits the results. Nothing here starts a thread
or touches CUDA.
"""

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
