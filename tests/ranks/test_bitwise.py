"""Equal bits, the exact check the suites and the mutants share: a NaN equals itself, -0.0 is not 0.0."""

from __future__ import annotations

import torch

from torchmatrix.ranks.bitwise import bits_equal
from torchmatrix.sensitivity.reverted_loads import same_state


def test_a_nan_equals_itself_and_a_signed_zero_differs():
    nan = torch.tensor([float("nan"), 1.0])
    assert bits_equal(nan, nan.clone()) and not torch.equal(nan, nan.clone())
    assert not bits_equal(torch.tensor([-0.0]), torch.tensor([0.0])) and torch.equal(
        torch.tensor([-0.0]), torch.tensor([0.0])
    )
    assert not bits_equal(torch.ones(2), torch.ones(2, dtype=torch.float64))
    assert not bits_equal(torch.ones(2), torch.ones(1, 2))
    assert bits_equal(torch.arange(3), torch.arange(3))


def test_a_mutant_compares_state_as_the_suites_do():
    """A restore that kept a NaN moment did not change it; one that flipped a zero's sign did."""
    saved = {"state": {0: {"exp_avg": torch.tensor([float("nan"), 0.0])}}, "param_groups": [{"lr": 0.1}]}
    kept = {"state": {0: {"exp_avg": torch.tensor([float("nan"), 0.0])}}, "param_groups": [{"lr": 0.1}]}
    flipped = {"state": {0: {"exp_avg": torch.tensor([float("nan"), -0.0])}}, "param_groups": [{"lr": 0.1}]}
    assert same_state(saved, kept)
    assert not same_state(saved, flipped)
