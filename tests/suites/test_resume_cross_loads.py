"""Which resume cells load their checkpoint into the other optimizer implementations: those stepping an
implementation other than the default, so that a matrix with the `optimizer_impl` axis does not repeat
the same loads in every default cell."""

from __future__ import annotations

import pytest

from suites.training_runs.implementation_loads import loads_into_others


@pytest.mark.parametrize(
    ("cell", "loads"),
    [
        ({"world_size": 2}, False),
        ({"world_size": 2, "optimizer_impl": "default"}, False),
        ({"world_size": 2, "optimizer_impl": "forloop"}, True),
        ({"world_size": 2, "optimizer_impl": "fused"}, True),
        ({"world_size": 4, "optimizer_impl": "compiled"}, True),
    ],
)
def test_only_a_cell_of_another_implementation_loads_into_the_rest(cell, loads):
    assert loads_into_others(cell) is loads
