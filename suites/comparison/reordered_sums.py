"""How far, to first order in the unit roundoff, the loss and linear functionals of the gradient can
move when every `nn.Linear` sums its contractions in another order, as tensor parallelism does.

A linear call computes three sums: its output y = x Wᵀ (+ b) over K in-features (a row-wise
projection adds up tp partial products there), its input's gradient dX = dY W over N out-features
(a column-wise projection all-reduces tp partials there) and its weight's gradient dW = dYᵀ X over T
token rows. Any evaluation of a sum of n products lies within γ_n Σ|terms| of the exact one (Higham,
section 3.1), so two evaluations lie within 2 γ_n Σ|terms| of each other, and a scalar φ computed
from them moves by at most Σ |∂φ/∂s| · 2 γ_n Σ|terms| over every element of every such sum s. For
φ = <r, gradient> the derivatives with respect to the backward's own sums come from a second
backward: each linear call's input gradient gets a zero probe added, and ∂φ/∂probe is ∂φ/∂dX.
Other operations run the same kernels on the same inputs on both sides and add nothing of their own.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from .gradient_functionals import Functional
from .summation_bounds import UNIT_ROUNDOFF, gamma


@dataclass
class LinearCall:
    """One call of a linear layer: its output and the zero probe on its input's gradient (None where
    the input needs none), each with the per-element bound of the sum that computes it."""

    output: torch.Tensor
    output_bound: torch.Tensor
    probe: torch.Tensor | None
    probe_bound: torch.Tensor | None = None
    backward_seen: bool = False


@dataclass
class ReorderedSums:
    """What one forward and one differentiable backward recorded: every linear call, and per
    parameter the bound of its own weight or bias gradient's sum over token rows."""

    unit_roundoff: float
    calls: list[LinearCall] = field(default_factory=list)
    parameter_bounds: dict[int, torch.Tensor] = field(default_factory=dict)
    loss_bound: float = 0.0
    pending_probes: dict[int, torch.Tensor] = field(default_factory=dict)

    def probe_input(self, module: nn.Linear, inputs: tuple):
        """Forward pre-hook: the input through a view of its own, whose gradient (this call's dX)
        gets a zero probe added, so a second backward can differentiate by dX."""
        x = inputs[0]
        if not x.requires_grad:
            return None
        probe = torch.zeros_like(x, requires_grad=True)
        self.pending_probes[id(module)] = probe
        alias = x.view_as(x)
        alias.register_hook(lambda grad: grad + probe)
        return (alias, *inputs[1:])

    def watch(self, module: nn.Linear, inputs: tuple, output: torch.Tensor) -> None:
        """Forward hook: the output's bound now, the backward sums' bounds when its gradient arrives."""
        probe = self.pending_probes.pop(id(module), None)
        if not output.requires_grad:
            return
        x, weight, bias = inputs[0].detach().double().abs(), module.weight.detach().double().abs(), module.bias
        magnitude = F.linear(x, weight, None if bias is None else bias.detach().double().abs())
        call = LinearCall(output, 2 * gamma(module.in_features + 1, self.unit_roundoff) * magnitude, probe)
        self.calls.append(call)
        output.register_hook(lambda grad: self.backward_sums(module, call, x, magnitude, grad))

    def backward_sums(self, module: nn.Linear, call: LinearCall, x, magnitude, grad: torch.Tensor) -> None:
        """Output-gradient hook, in the first backward only (a second one passes here too): the loss's
        share through this output, and the bounds of dX, dW and db."""
        if call.backward_seen:
            return
        call.backward_seen = True
        dy = grad.detach().double().abs()
        self.loss_bound += float((dy * call.output_bound).sum())
        weight = module.weight.detach().double().abs()
        if call.probe is not None:
            call.probe_bound = 2 * gamma(module.out_features, self.unit_roundoff) * (dy @ weight)
        rows_dy, rows_x = dy.reshape(-1, module.out_features), x.reshape(-1, module.in_features)
        factor = 2 * gamma(rows_dy.shape[0], self.unit_roundoff)
        self.add_parameter_bound(module.weight, factor * (rows_dy.T @ rows_x))
        if module.bias is not None:
            self.add_parameter_bound(module.bias, factor * rows_dy.sum(0))

    def add_parameter_bound(self, parameter: nn.Parameter, bound: torch.Tensor) -> None:
        key = id(parameter)
        self.parameter_bounds[key] = self.parameter_bounds[key] + bound if key in self.parameter_bounds else bound

    def functional_bounds(self, values: torch.Tensor, directions: list[dict[int, torch.Tensor]]) -> list[float]:
        """First-order bound of how far each of `values` (value i = Σ_p <directions[i][p], gradient of p>,
        built with create_graph) moves: through every linear call's output and input gradient (one
        backward batched over the values), and directly through each parameter's own gradient sum."""
        sources = [(call.output, call.output_bound) for call in self.calls]
        sources += [(call.probe, call.probe_bound) for call in self.calls if call.probe_bound is not None]
        through_sums = [0.0] * len(directions)
        if values.requires_grad and sources:
            derivatives = torch.autograd.grad(
                values,
                [tensor for tensor, _ in sources],
                grad_outputs=torch.eye(len(directions), dtype=values.dtype, device=values.device),
                is_grads_batched=True,
                retain_graph=True,
                allow_unused=True,
            )
            for derivative, (_, limit) in zip(derivatives, sources, strict=True):
                if derivative is not None:
                    weighted = derivative.detach().double().abs() * limit
                    through_sums = [total + float(w.sum()) for total, w in zip(through_sums, weighted, strict=True)]
        return [
            total
            + sum(
                float((direction.double().abs() * self.parameter_bounds[key]).sum())
                for key, direction in weights.items()
                if key in self.parameter_bounds
            )
            for total, weights in zip(through_sums, directions, strict=True)
        ]


@contextmanager
def reordered_sums(model: nn.Module, dtype: str = "float32"):
    """Yields a ReorderedSums that records the linear calls of the forward and backward run inside the
    block. Eager and with SDPA's math kernel: hooks are side effects a compiled block would refuse,
    and the fused attention kernels have no second derivative."""
    sums = ReorderedSums(UNIT_ROUNDOFF[dtype])
    linears = [module for module in model.modules() if isinstance(module, nn.Linear)]
    handles = [module.register_forward_pre_hook(sums.probe_input) for module in linears]
    handles += [module.register_forward_hook(sums.watch) for module in linears]
    try:
        with torch.compiler.set_stance("force_eager"), sdpa_kernel(SDPBackend.MATH):
            yield sums
    finally:
        for handle in handles:
            handle.remove()


def reordering_bounds(model: nn.Module, named: list, loss_of_model, functionals: list[Functional]):
    """One forward (`loss_of_model()`) and autograd's gradient of it, differentiated once more: the
    first-order bound of the loss and of each functional of the gradient of the parameters `named`
    ((name, parameter) pairs, the names the functionals use)."""
    named = [(name, param) for name, param in named if param.requires_grad]
    keys = {name: id(param) for name, param in named}
    with reordered_sums(model) as sums:
        loss = loss_of_model()
        gradients = torch.autograd.grad(loss, [param for _, param in named], create_graph=True, allow_unused=True)
        held = {name: gradient for (name, _), gradient in zip(named, gradients, strict=True) if gradient is not None}
        zero = next(iter(held.values())).new_zeros(())  # a functional weighing no gradient still stacks
        values, directions = [], []
        for functional in functionals:
            weights = {name: d for name, d in functional.directions.items() if name in held}
            values.append(sum(((d.to(held[name]) * held[name]).sum() for name, d in weights.items()), zero))
            directions.append({keys[name]: d for name, d in weights.items()})
        bounds = sums.functional_bounds(torch.stack(values), directions)
    return sums.loss_bound, bounds
