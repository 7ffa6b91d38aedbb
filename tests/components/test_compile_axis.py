"""Which torch.compile backends a cell runs, which decides what the runner prepares for its ranks
(torchmatrix.ranks.compiler_warmup): Inductor's keys and ISA probe only where Inductor compiles."""

from __future__ import annotations

import pytest

from torchmatrix.components.compile_axis import compile_backends


@pytest.mark.parametrize(
    ("cell", "backends"),
    [
        ({"world_size": 1}, set()),
        ({"compile": "none", "optimizer_impl": "fused"}, set()),
        ({"compile": "aot_eager"}, {"aot_eager"}),
        ({"compile": "inductor", "optimizer_impl": "fused"}, {"inductor"}),
        ({"compile": "none", "optimizer_impl": "compiled"}, {"inductor"}),
        ({"compile": "aot_eager", "optimizer_impl": "compiled"}, {"aot_eager", "inductor"}),
        ({"compile": "my_backend"}, {"my_backend"}),
    ],
)
def test_a_cell_compiles_with_its_blocks_backend_and_its_compiled_steps(cell, backends):
    assert compile_backends(cell) == backends
