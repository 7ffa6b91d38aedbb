"""A compiled cell's training steps against its eager twin: the same components built again from the same
seed and parallelized for the same cell, then stepped under ``torch.compiler.set_stance("force_eager")``.

Both builds see the same cell, so the factory builds the same depth and ``parallelize`` the same
tensor-parallel plan, FSDP units and compile wrappers; only how the steps run differs. Under
``force_eager`` every compiled block runs as Python again: ``torch.compiler.is_compiling()`` is False and
every value is read when the step runs, which is what a model that computes something else once compiled
(models/mutants/eager_twin.py) gets wrong. Several steps, each forward+backward on the same batches then the
same SGD update on both, since a value baked in at the first trace only shows from the second step on.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from torchmatrix.testing import current_device, data_parallel_rank, load, reset_keeping_time, root_cause

from ..comparison.deterministic import deterministic_algorithms
from ..comparison.differences import tensor_difference
from ..comparison.ulp import ulp_distance
from ..components.parallelize_component import parallelized
from ..components.training_step import build_training_step
from ..state.built_names import named_buffers_as_built, named_parameters_as_built

SEED = 0
TWIN_STEPS = 3
LEARNING_RATE = 2**-4
"""The twins' update, p -= LEARNING_RATE * grad: small beside the parameters, so a step carries at most its
own rounding difference into the next (the bound's derivation below)."""
KERNEL_KEEPING_BACKENDS = ("eager", "aot_eager")
"""Backends whose graphs call torch's own ATen kernels: a compiled step equals eager's bit for bit."""

# A kernel-generating backend (inductor, or a user's) computes in kernels of its own what eager computes
# in ATen's. With u = 2**-24 (float32's unit roundoff), what it can change, per op of the step:
# - a reduction of K float32 terms it generates (a norm's mean of squares, softmax's and cross-entropy's
#   sums, a norm weight's gradient summed over tokens, the embedding's backward): either order is within
#   (K - 1) u of the terms' magnitudes from the exact sum, so the two are within 2 (K - 1) u;
# - an elementwise op in a fused kernel: rounded once per op on both sides, but Inductor's C++ compiler may
#   contract a*b+c into one FMA and it calls its own vectorised exp, erf, tanh, rsqrt: each side within
#   1 ulp = 2u of the exact result, so 4u per op.
# Matmuls and SDPA are not counted: Inductor hands them to the same ATen (oneDNN, cuBLAS) kernels as eager,
# so on equal inputs they round alike (a max-autotune GEMM template would add each matmul's K). Taking each
# op to pass its inputs' relative difference on unamplified at the tensor's own scale (first order; what a
# per-tensor bound at max|eager| can hold), a tensor differs by at most the sum over the ops on its longest
# chain. The reference decoder's step (one prefix and one expert layer, each two RMSNorms of 32, GELU,
# softmax over 16 keys; a 64-way cross-entropy and a 30-token mean; their backward) sums to about 1620u:
# forward 700, backward 920. The bound allows 2**11 u per step: STEP_RTOL = 2**-13. The update then carries
# LEARNING_RATE * |grad difference| into the parameters, at most one step's bound where the update is
# smaller than the parameters, so step s (from 1) is held to s * STEP_RTOL.
STEP_RTOL = 2**11 * 2**-24


@dataclass(frozen=True)
class TwinBound:
    """How close a compiled step must be to its eager twin: bit for bit, or per tensor
    max|compiled - eager| <= step x STEP_RTOL x max|eager|; ``describe`` is what a failure names beside the cell."""

    exact: bool

    def describe(self) -> str:
        if self.exact:
            return "eager twin bit for bit"
        return f"eager twin within s x {STEP_RTOL} x max|eager| per tensor at step s"

    def allows(self, size: float, step: int) -> bool:
        """Whether a difference of ``size`` (max|Δ| / max|eager|, 0 for equal bits) passes at ``step``."""
        return size == 0 or (not self.exact and size <= step * STEP_RTOL)


def relative_size(compiled: torch.Tensor | None, eager: torch.Tensor | None) -> float:
    """max|compiled - eager| / max|eager|: 0 for equal bits, inf where one side is missing, the dtypes or
    shapes differ, a non-float tensor differs, or eager is all zeros and compiled is not."""
    if compiled is None or eager is None:
        return 0.0 if compiled is eager else float("inf")
    if tensor_difference(compiled, eager) is None:
        return 0.0
    if not compiled.is_floating_point() or compiled.dtype != eager.dtype or compiled.shape != eager.shape:
        return float("inf")
    largest = (compiled.double() - eager.double()).abs().nan_to_num(float("inf")).max().item()
    scale = eager.double().abs().max().item()
    return largest / scale if scale else float("inf")


def described(compiled: torch.Tensor | None, eager: torch.Tensor | None, size: float) -> str:
    """What differs between the twins' copies of one tensor, in words."""
    if compiled is None or eager is None:
        return f"{'none' if compiled is None else 'one'} in the compiled step, {'none' if eager is None else 'one'} in the eager twin"
    exactly = tensor_difference(compiled, eager, reference="eager")
    return exactly if size == float("inf") else f"{exactly}, max |Δ| / max|eager| {size:.2e}"


def twin_bound(cell, bf16: bool) -> TwinBound | None:
    """The bound for the cell's backend; None for a kernel-generating backend in bfloat16, where Inductor
    keeps a fused chain in float32 and rounds once while eager rounds to bf16 after every op, so the twins
    differ by a bf16 ulp (2**-8) per op of the chain and no useful bound is left."""
    exact = str(cell["compile"]) in KERNEL_KEEPING_BACKENDS
    if bf16 and not exact:
        return None
    return TwinBound(exact)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor, or the tensor, as a detached CPU copy."""
    return (tensor.to_local() if isinstance(tensor, DTensor) else tensor).detach().to("cpu", copy=True)


def step_tensors(model, loss: torch.Tensor) -> dict[str, torch.Tensor | None]:
    """What one step left to compare, in the order a difference is named: the loss, each parameter's
    gradient (this rank's shard; None without one), each buffer, by the names the model was built with."""
    found: dict[str, torch.Tensor | None] = {"the loss": loss.detach().float().to("cpu", copy=True)}
    found |= {
        f"gradient of {n}": None if p.grad is None else local(p.grad) for n, p in named_parameters_as_built(model)
    }
    found |= {f"buffer {n}": local(b) for n, b in named_buffers_as_built(model)}
    return found


@torch.no_grad()
def sgd_update(model) -> None:
    """p -= LEARNING_RATE * grad for every parameter with a gradient, then drop the gradients."""
    for parameter in model.parameters():
        if parameter.grad is not None:
            parameter.add_(parameter.grad, alpha=-LEARNING_RATE)
            parameter.grad = None


def batch_seed(rank: int, step: int) -> int:
    """This data-parallel rank's batch seed at ``step``: the same for both twins."""
    return SEED + 1 + rank + 1000 * step


@contextmanager
def stage(cell, what: str):
    """Re-raise an error of ``what`` naming the cell, torch version and backend, with the root cause first."""
    try:
        yield
    except Exception as error:
        raise RuntimeError(
            f"cell {cell.id}, torch {torch.__version__}, compile={cell['compile']}: {what} failed: {root_cause(error)}"
        ) from error


def compared(compiled: dict, eager: dict, bound: TwinBound, step: int) -> list[tuple[int, str, float]]:
    """(position, line, size) per tensor the bound does not allow, in ``compiled``'s order (a tensor only the
    eager twin has comes last), with size = max|Δ| / max|eager|."""
    order = [*compiled, *(key for key in eager if key not in compiled)]
    found = []
    for position, key in enumerate(order):
        size = relative_size(compiled.get(key), eager.get(key))
        if not bound.allows(size, step):
            found.append((position, f"{key}: {described(compiled.get(key), eager.get(key), size)}", size))
    return found


def used(compiled: dict, eager: dict, step: int) -> tuple[int, float]:
    """The largest ULP distance between the twins' float tensors, and the largest fraction of the
    kernel-generating bound (step x STEP_RTOL) any tensor used: the figures a passing cell records."""
    max_ulp, fraction = 0, 0.0
    for key in compiled.keys() & eager.keys():
        a, b = compiled[key], eager[key]
        if a is None or b is None or not a.is_floating_point() or a.dtype != b.dtype or a.shape != b.shape:
            continue
        if a.dtype in (torch.float32, torch.bfloat16, torch.float16):
            max_ulp = max(max_ulp, ulp_distance(a, b))
        fraction = max(fraction, relative_size(a, b) / (step * STEP_RTOL))
    return max_ulp, fraction


def compare_with_eager_twin(cell, components: dict, dtype: str, bound: TwinBound) -> dict:
    """Rank function: TWIN_STEPS steps of the compiled build and of its eager twin, compared after each;
    per step what the bound does not allow, in order (loss, gradients, buffers), and the figures used()."""
    build_model, make_batch = (load(components[name]) for name in ("model", "batch"))
    device = current_device()
    rank = data_parallel_rank(cell)
    # Compile as a fresh training process does: a graph the cell's other tests compiled (for other model
    # instances, another sequence length, dynamic shapes) would make this step depend on what ran before.
    reset_keeping_time()
    twins = {}
    for twin in ("compiled", "eager"):
        torch.manual_seed(SEED)
        with stage(cell, f"building the {twin} twin ({components['model']}, then parallelize)"):
            # No checkpointing: the twins compare compiling; grad_ckpt's other tests compare checkpointing.
            model = build_model(cell, dropout=0.0, dtype=getattr(torch, dtype))
            model = parallelized(components, model, cell, device=device, activation_checkpointing=False)
        model.train()
        twins[twin] = (model, build_training_step(components, model=model, optimizer=None, cell=cell))
    initial = compared(
        *({f"parameter {n}": local(p) for n, p in named_parameters_as_built(model)} for model, _ in twins.values()),
        TwinBound(exact=True),
        0,
    )
    steps, max_ulp, bound_used = [], 0, 0.0
    with deterministic_algorithms():
        for step in range(1, TWIN_STEPS + 1):
            batch = make_batch(twins["compiled"][0], seed=batch_seed(rank, step), device=device)
            left = {}
            for twin, (model, training_step) in twins.items():
                stance = "default" if twin == "compiled" else "force_eager"
                with stage(cell, f"step {step} of the {twin} twin"), torch.compiler.set_stance(stance):
                    loss = training_step.loss(batch)
                    training_step.backward(loss)
                left[twin] = step_tensors(model, loss)
                sgd_update(model)
            steps.append(compared(left["compiled"], left["eager"], bound, step))
            step_ulp, step_used = used(left["compiled"], left["eager"], step)
            max_ulp, bound_used = max(max_ulp, step_ulp), max(bound_used, step_used)
    return {"initial": [line for _, line, _ in initial], "steps": steps, "max_ulp": max_ulp, "bound_used": bound_used}


def first_difference(results: list[dict]) -> tuple[int, int, str, str] | None:
    """(step, rank, first, largest) where the twins first differ: the earliest step; on it the first tensor
    in the order loss, gradients, buffers (as the model was built), the lowest rank first; and the line of
    the tensor that differs most on it, which points at the cause when a difference spreads."""
    for step in range(TWIN_STEPS):
        found = [
            (position, rank, line, size) for rank, r in enumerate(results) for position, line, size in r["steps"][step]
        ]
        if found:
            _, rank, first, _ = min(found)
            largest = max(found, key=lambda difference: difference[3])
            return step + 1, rank, first, f"rank {largest[1]}: {largest[2]}"
    return None


def step_lines(results: list[dict], step: int) -> list[str]:
    """Every difference of one step (from 1), per rank: the evidence under the headline."""
    return [f"rank {rank}: {line}" for rank, r in enumerate(results) for _, line, _ in r["steps"][step - 1]]
