"""The `optimizer_adamw` component: torchtitan's own `OptimizersContainer`, built from the model by
its `default_adamw()` config (one AdamW over every parameter, its default fused implementation)
with the suite's hyperparameters, as its trainer builds it after parallelizing the model."""

from __future__ import annotations

from torchtitan.components.optimizer import OptimizersContainer, default_adamw


def build_adamw(
    params, *, lr: float, betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.1, model
) -> OptimizersContainer:
    config = default_adamw(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    return config.build(model_parts=[model])
