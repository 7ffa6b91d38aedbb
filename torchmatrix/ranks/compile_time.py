"""The seconds a process has spent in torch.compile, as torch itself attributes them, across resets.

Dynamo times every compile it runs: `entire_frame_compile` (tracing a frame, AOTAutograd, the
backend's forward compile or its cache load) and `entire_backward_compile` (the backward's lazy
compile at its first run), summed in `torch._dynamo.utils.cumulative_time_spent_ns`. That is the
truthful figure: it is the time compiling took, wherever it happened (a first forward, a first
backward, a recompile mid-test), and not the first call's time, which also runs the step.
`torch.compiler.reset()` clears those sums, so a rank resets through `reset_keeping_time`.
"""

from __future__ import annotations

import sys

PHASES = ("entire_frame_compile", "entire_backward_compile")
_before_resets = 0.0


def compile_seconds() -> float:
    """This process's compile seconds so far; 0 where Dynamo was never imported."""
    return _before_resets + _since_reset()


def _since_reset() -> float:
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    spent = getattr(dynamo_utils, "cumulative_time_spent_ns", None) or {}
    return sum(spent.get(phase, 0.0) for phase in PHASES) / 1e9


def reset_keeping_time() -> None:
    """`torch.compiler.reset()`, keeping what this process compiled so far in `compile_seconds`."""
    global _before_resets
    import torch

    _before_resets += _since_reset()
    torch.compiler.reset()
