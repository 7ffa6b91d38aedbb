"""The `optimizer_adamw` component: AdamW as torchtitan's `default_adamw()` builds it (torch's
AdamW over every parameter, its fused implementation), with the suite's hyperparameters. Built
from (name, param) pairs, as torchtitan's OptimizersContainer builds it, so torch records the
`param_names` torchtitan's checkpoint helpers key the state by."""

from __future__ import annotations

import torch


def build_adamw(
    params, *, lr: float, betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.1, named_parameters
):
    return torch.optim.AdamW(named_parameters, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)
