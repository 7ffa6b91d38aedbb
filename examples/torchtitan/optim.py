"""The `optimizer_adamw` component: AdamW as torchtitan's `default_adamw()` builds it (torch's
AdamW over every parameter, its fused implementation), with the suite's hyperparameters."""

from __future__ import annotations

import torch


def build_adamw(params, *, lr: float, betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.1):
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)
