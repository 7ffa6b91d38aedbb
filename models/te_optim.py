"""The `te_fused_adam` optimizer value: TransformerEngine's FusedAdam configured as the
precision-aware optimizer of a mixed-precision stack (fp32 master weights, bf16 moments).

This module imports transformer_engine at import time, so where it is not installed resolving
the component raises ModuleNotFoundError, which the suites turn into a skip with that reason.
"""

from __future__ import annotations

import torch
from transformer_engine.pytorch.optimizers import FusedAdam


def build_te_fused_adam(params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0) -> FusedAdam:
    """FusedAdam in AdamW mode with fp32 master weights and bf16 exp_avg / exp_avg_sq."""
    return FusedAdam(
        params,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        adam_w_mode=True,
        master_weights=True,
        master_weight_dtype=torch.float32,
        exp_avg_dtype=torch.bfloat16,
        exp_avg_sq_dtype=torch.bfloat16,
    )
