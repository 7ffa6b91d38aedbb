"""suites/comparison/reordered_sums.py bounds what a real reordering moves: an MLP whose linear layers add up
tp = 2 partial products, as row- and column-wise tensor parallelism do, against the same MLP
summing whole: its loss and every functional of its gradient within their first-order bounds, and
those bounds far below a gradient summed twice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchmatrix.suites.comparison.gradient_functionals import functionals_of
from torchmatrix.suites.comparison.reordered_sums import reordering_bounds

WIDTH, HIDDEN, TOKENS = 32, 64, 48


class SplitLinear(nn.Linear):
    """Each half of the out-features computed from two halves of the in-features, then joined: the
    output sums two partial products (row-wise) and the input's gradient two halves' (column-wise)."""

    def forward(self, x):
        half_in, half_out = self.in_features // 2, self.out_features // 2

        def rows(part: slice) -> torch.Tensor:
            weight = self.weight[part]
            return F.linear(x[..., :half_in], weight[:, :half_in]) + F.linear(x[..., half_in:], weight[:, half_in:])

        return torch.cat([rows(slice(0, half_out)), rows(slice(half_out, None))], dim=-1) + self.bias


def mlp(linear: type[nn.Linear]) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(linear(WIDTH, HIDDEN), nn.GELU(), linear(HIDDEN, HIDDEN), nn.Tanh(), linear(HIDDEN, WIDTH))


def loss_of(model: nn.Module) -> torch.Tensor:
    inputs = torch.randn(TOKENS, WIDTH, generator=torch.Generator().manual_seed(1))
    targets = torch.randn(TOKENS, WIDTH, generator=torch.Generator().manual_seed(2))
    return F.mse_loss(model(inputs), targets)


def gradients(model: nn.Module) -> tuple[float, dict[str, torch.Tensor]]:
    loss = loss_of(model)
    loss.backward()
    return loss.item(), {name: param.grad.clone() for name, param in model.named_parameters()}


@pytest.fixture(scope="module")
def twins():
    whole, split = mlp(nn.Linear), mlp(SplitLinear)
    loss, mean = gradients(whole)
    reordered_loss, reordered = gradients(split)
    functionals = functionals_of(mean)
    loss_bound, bounds = reordering_bounds(whole, list(whole.named_parameters()), lambda: loss_of(whole), functionals)
    return loss, reordered_loss, loss_bound, mean, reordered, functionals, bounds


def test_reordered_loss_lies_within_its_bound(twins):
    loss, reordered_loss, loss_bound, *_ = twins
    assert 0 < loss_bound < 1e-4 * abs(loss)
    assert abs(reordered_loss - loss) <= loss_bound


def test_reordered_gradient_functionals_lie_within_their_bounds(twins):
    _, _, _, mean, reordered, functionals, bounds = twins
    differences = [abs(f.of(reordered) - f.of(mean)) for f in functionals]
    assert any(differences), "the split layers summed exactly alike: nothing was reordered"
    for functional, difference, bound in zip(functionals, differences, bounds, strict=True):
        assert difference <= bound, f"{functional.name}: |diff| {difference:.3e} over its bound {bound:.3e}"
        assert bound < 1e-2 * abs(functional.of(mean)) or functional.name.startswith("every"), (
            f"{functional.name}: bound {bound:.3e} too loose to tell a gradient summed twice"
        )


def test_gradient_summed_twice_breaks_its_tensors_bound(twins):
    _, _, _, mean, reordered, functionals, bounds = twins
    doubled = dict(reordered, **{"2.weight": 2 * reordered["2.weight"]})
    broken = [f.name for f, bound in zip(functionals, bounds) if abs(f.of(doubled) - f.of(mean)) > bound]
    assert "2.weight (its sign pattern)" in broken and "0.weight (its sign pattern)" not in broken, broken
