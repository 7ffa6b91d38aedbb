"""How far, to first order in the unit roundoff, a loss can move when every `nn.Linear` of the model
sums its dot products in another order, as tensor parallelism does (a row-wise projection adds up tp
partial products): each output element y = sum_k x_k w_k then moves by at most
2 gamma_(K+1) sum_k |x_k||w_k| (both orders' errors; K in-features and a bias), and the loss by that times
|dL/dy|, summed over every output element of every linear layer. Other operations run the same
kernels on the same inputs in both evaluations, so they add no difference of their own."""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .summation_bounds import UNIT_ROUNDOFF, gamma


@contextmanager
def linear_rounding_bound(model: nn.Module, dtype: str = "float32"):
    """Yields a list that, after the block's forward and backward, holds one float per linear layer
    call: its share of the first-order loss bound."""
    shares: list[float] = []

    def watch(module: nn.Linear, inputs, output: torch.Tensor) -> None:
        if not output.requires_grad:
            return
        magnitude = F.linear(inputs[0].detach().abs().double(), module.weight.detach().abs().double())
        factor = 2 * gamma(module.in_features + 1, UNIT_ROUNDOFF[dtype])
        output.register_hook(
            lambda grad: shares.append(factor * (grad.detach().abs().double() * magnitude).sum().item())
        )

    handles = [module.register_forward_hook(watch) for module in model.modules() if isinstance(module, nn.Linear)]
    try:
        yield shares
    finally:
        for handle in handles:
            handle.remove()
