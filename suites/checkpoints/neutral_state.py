"""Training state in a form every torch version reads the same: JSON, tensors as dtype, shape and raw bytes.

The cross_version suite keeps what a checkpoint must restore next to the checkpoint in this form,
so a reader under another torch compares against values no torch format stood between.
"""

from __future__ import annotations

import base64

import torch


def neutral(value):
    """`value` with every tensor as {"dtype", "shape", "bytes"} (base64), tuples as lists, bytes as base64."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().to("cpu").contiguous()
        raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        return {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape), "bytes": _b64(raw)}
    if isinstance(value, dict):
        return {str(key): neutral(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [neutral(item) for item in value]
    if isinstance(value, bytes):
        return {"bytes": _b64(value)}
    return value


def tensor_of(encoded: dict) -> torch.Tensor:
    """The tensor a neutral() encoding holds."""
    dtype = getattr(torch, encoded["dtype"])
    raw = bytearray(base64.b64decode(encoded["bytes"]))
    if not raw:
        return torch.empty(encoded["shape"], dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(encoded["shape"])


def decoded(value):
    """A neutral() form back as tensors (each its own copy), lists and plain values."""
    if isinstance(value, dict) and set(value) >= {"dtype", "shape", "bytes"}:
        return tensor_of(value).clone()
    if isinstance(value, dict):
        return {key: decoded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decoded(item) for item in value]
    return value


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")
