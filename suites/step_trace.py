"""Where a resumed run first parts from the straight one: per training step, a digest of each thing
that feeds it (the batch, the learning rate, non-persistent buffers, RNG streams, parameters), of
the gradients it makes and of the parameters its update leaves, so a red "loss at step N" names the
step and the first quantity that differs there, and so the piece of the stack that holds it."""

from __future__ import annotations

import hashlib
import pickle

import torch

QUANTITIES = (
    ("batch", "batch the loader yields"),
    ("lr", "learning rate the scheduler set"),
    ("non_persistent_buffers", "model's non-persistent buffers (in no state dict)"),
    ("rng", "RNG streams (the process's, and the generators the model, data, optimizer or scheduler own)"),
    ("parameters", "parameters before the step"),
    ("gradients", "gradients, with equal batch, learning rate, buffers, RNG streams and parameters (forward or backward differs)"),
    ("updated", "parameters after the step, with equal gradients (the optimizer's update differs: its state or its own attributes)"),
)  # fmt: skip
"""Each quantity a step records, in the order a step uses them, with what it is and who holds it."""


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


def first_divergence(straight: list[dict], resumed: list[dict], first_step: int) -> str | None:
    """Where the resumed steps (from `first_step` on) first differ from the straight run's same
    steps: the step and the first quantity of QUANTITIES that differs, with up to three names; None
    when every recorded quantity agrees."""
    for step, (a, b) in enumerate(zip(straight, resumed), start=first_step):
        for quantity, what in QUANTITIES:
            names = sorted(
                name
                for name in a[quantity].keys() | b[quantity].keys()
                if a[quantity].get(name) != b[quantity].get(name)
            )
            if names:
                more = f" and {len(names) - 3} more" if len(names) > 3 else ""
                return f"the runs first part at step {step}, in the {what}: {', '.join(names[:3])}{more}"
    return None
