"""Where a resumed run first parts from the straight one: per training step, a digest of each thing
that feeds it (the batch, the learning rate, non-persistent buffers, RNG streams, parameters), of
the gradients it makes and of the parameters its update leaves. A red "loss at step N" then names
the first step whose gradients or update differ, and what differs among that step's inputs: the
piece of the stack to look at (the loader, the scheduler, the model's buffers, a generator, the
optimizer)."""

from __future__ import annotations

import hashlib
import pickle

import torch

STEP_INPUTS = (
    ("batch", "the batch the loader yields"),
    ("non_persistent_buffers", "the model's non-persistent buffers (in no state dict)"),
    ("rng", "RNG streams (the process's, and generators the model, data, optimizer or scheduler own)"),
    ("parameters", "the parameters before the step"),
)
"""What a step's forward and backward read, as the trace records it, with who holds it."""


def digest(value) -> bytes:
    """A short fingerprint of a tensor (its bytes, dtype and shape) or of a nest of tensors in dicts,
    lists and tuples, equal exactly when the values are."""
    return hashlib.blake2b(pickle.dumps(fingerprint(value)), digest_size=16).digest()


def fingerprint(value):
    if isinstance(value, torch.Tensor):
        plain = value.detach().to("cpu").contiguous()
        return (str(plain.dtype), tuple(plain.shape), plain.view(-1).view(torch.uint8).numpy().tobytes())
    if isinstance(value, dict):
        return tuple((repr(key), fingerprint(item)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(fingerprint(item) for item in value)
    return repr(value)


def digests(named: dict) -> dict[str, bytes]:
    """`digest` of each value, by name."""
    return {name: digest(value) for name, value in named.items()}


def differing(first: dict, second: dict, quantity: str) -> str:
    """The names under `quantity` whose digests differ between two step records, up to three; "" when none."""
    names = sorted(
        name
        for name in first[quantity].keys() | second[quantity].keys()
        if first[quantity].get(name) != second[quantity].get(name)
    )
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more


def first_divergence(straight: list[dict], resumed: list[dict], first_step: int) -> str | None:
    """Where the resumed steps (from `first_step` on) first make other gradients or another update
    than the straight run's same steps, and which of that step's inputs differ (the gradients), or
    whether the learning rate or the optimizer's own update does (the update); None when none does."""
    for step, (a, b) in enumerate(zip(straight, resumed), start=first_step):
        if gradients := differing(a, b, "gradients"):
            inputs = [f"{what}: {names}" for quantity, what in STEP_INPUTS if (names := differing(a, b, quantity))]
            cause = (
                "; ".join(inputs)
                or "none the suite records, so the forward or backward itself, or state it reads that the suite cannot see"
            )
            return f"the runs first part at step {step}, in the gradients ({gradients}); of that step's inputs, these differ: {cause}"
        if updated := differing(a, b, "updated"):
            lr = differing(a, b, "lr")
            cause = (
                f"the learning rate the scheduler set differs ({lr})"
                if lr
                else "with equal gradients and learning rate, the optimizer's update differs (its state, or what it keeps on itself)"
            )
            return f"the runs first part at step {step}, in the parameters after the step ({updated}): {cause}"
    return None
