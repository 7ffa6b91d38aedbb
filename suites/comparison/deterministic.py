"""Deterministic kernels for the suites' exact comparisons (shared by grad_ckpt and resume)."""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch


@contextmanager
def deterministic_algorithms():
    """Kernels that return the same bits for the same inputs while a suite compares exactly.

    CUDA's embedding and attention backward use atomics unless told otherwise, and cuBLAS is
    only deterministic with CUBLAS_WORKSPACE_CONFIG set; an op without a deterministic kernel
    then raises instead of passing noise off as a bug. Rank processes serve other suites too,
    so the previous setting comes back afterwards.
    """
    enabled, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
