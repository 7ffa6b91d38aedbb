"""What ranks simulated as CPU processes on gloo cannot do that the same stack does on GPUs with NCCL.

A test that fails on CPU with one of these root causes hit a limit of the simulation, not a bug of
the stack: it is recorded as a CPU-simulation limit, with the change that works around it, and
neither fails the run nor counts as a regression. On a GPU the same text is a real failure. Each
pattern is torch 2.13's own message, from its start, so that no other failure reads as a limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torchmatrix.status import Status

CPU = "cpu"


@dataclass(frozen=True)
class SimulationLimit:
    """One thing the CPU simulation cannot do: torch's messages for it, why, and what works around it."""

    name: str
    cause: str
    messages: tuple[str, ...]
    hint: str

    def matches(self, root_cause: str) -> bool:
        """Whether a failure's root cause line (`ExcType: message`) is one of this limit's messages."""
        return any(re.match(rf"[\w.]+: {re.escape(message)}", root_cause) for message in self.messages)


LIMITS = (
    SimulationLimit(
        "PREMUL_SUM on gloo",
        "FSDP2 with a gradient divide factor reduce-scatters with ReduceOp.PREMUL_SUM, which NCCL has and gloo lacks",
        ("Cannot use ReduceOp.PREMUL_SUM with Gloo",),
        "call set_force_sum_reduction_for_comms(True) on the fully_shard modules in CPU cells, or drop the divide factor",
    ),
    SimulationLimit(
        "FlexAttention backward on CPU",
        "torch's FlexAttention has no backward on CPU, compiled or not",
        ("FlexAttention does not support backward on CPU",),
        "use the sdpa attention path in CPU cells",
    ),
    SimulationLimit(
        "CUDA on a machine without GPUs",
        'code that builds a "cuda" device mesh, moves tensors to cuda or sets a cuda device',
        (
            "Torch not compiled with CUDA enabled",
            "Found no NVIDIA driver on your system",
            "No CUDA GPUs are available",
            "module 'torch._C' has no attribute '_cuda_",
        ),
        'take the device from the `device` argument or torchmatrix.testing.current_device(), never "cuda"',
    ),
    SimulationLimit(
        "NCCL on a machine without GPUs",
        "code that creates a process group or device mesh with the nccl backend",
        (
            "Distributed package doesn't have NCCL built in",
            "ProcessGroupNCCL is only supported with GPUs, no GPUs found!",
        ),
        'use the process group the ranks already have (gloo on CPU, NCCL on GPUs), never backend="nccl"',
    ),
)


def limit_of(root_cause: str) -> SimulationLimit | None:
    """The known limit a failure's root cause line names, if any."""
    return next((limit for limit in LIMITS if limit.matches(root_cause)), None)


def as_simulation_limit(result: dict, device_type: str) -> dict:
    """A test's result (status, message, text) as a CPU-simulation limit when it failed on CPU with a
    known limit's root cause: its message says so and how to work around it, its text stays whole."""
    limit = limit_of(result["message"]) if device_type == CPU else None
    if limit is None or not Status(result["status"]).is_failing:
        return result
    return {**result, "status": Status.SIMULATION_LIMIT.value, "message": limit_message(result["message"], limit)}


def limit_message(root_cause: str, limit: SimulationLimit) -> str:
    """`CPU-simulation limit: <root cause>; hint: <what works around it>`, as every report shows it."""
    return f"{Status.SIMULATION_LIMIT}: {root_cause}; hint: {limit.hint}"


def markdown_table() -> str:
    """The known limits as docs/explanation/cpu-simulation.md lists them: one row per limit."""
    rows = ["| limit | why | torch's message starts with | what works around it |", "|---|---|---|---|"]
    for limit in LIMITS:
        messages = "<br>".join(f"`{message}`" for message in limit.messages)
        rows.append(f"| {limit.name} | {limit.cause} | {messages} | {limit.hint} |")
    return "\n".join(rows)
