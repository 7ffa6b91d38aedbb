"""One random stream for grad_ckpt's two compiled steps on CUDA.

On CUDA, torch.compile draws the random numbers of a checkpointed region from graph-safe RNG states of
its own (``torch._functorch.config.graphsafe_rng_functionalization``), while an un-checkpointed graph
draws from the global generator: the two steps apply different dropout masks by design, so no
comparison of them could be exact. With it off for both steps, both draw from the global generator and
the recompute replays the state its forward saved, which is what the suite compares.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

GRAPH_SAFE_RNG_OFF = "graph-safe RNG off in both steps (torch._functorch.config.graphsafe_rng_functionalization)"


def graph_safe_rng_applies(device: torch.device, compiled: bool) -> bool:
    """Whether this torch would give a compiled step's checkpointed regions random numbers of their own here."""
    if not compiled or device.type != "cuda":
        return False
    import torch._functorch.config as functorch_config

    return hasattr(functorch_config, "graphsafe_rng_functionalization")


def one_random_stream(device: torch.device, compiled: bool) -> AbstractContextManager:
    """Graph-safe RNG off while the steps run, where it applies; nothing elsewhere."""
    if not graph_safe_rng_applies(device, compiled):
        return nullcontext()
    import torch._functorch.config as functorch_config

    return functorch_config.patch(graphsafe_rng_functionalization=False)
