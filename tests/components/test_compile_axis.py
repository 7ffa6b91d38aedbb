"""Which torch.compile backends a cell runs, which decides what the runner prepares for its ranks
(torchmatrix.ranks.compiler_warmup): Inductor's keys and ISA probe only where Inductor compiles."""

from __future__ import annotations

import pytest

from torchmatrix.components.compile_axis import aot_eager_alone, compile_backends, graphs_kept


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


@pytest.mark.parametrize(
    ("cell", "kept", "alone"),
    [
        ({"compile": "none"}, False, False),
        ({"compile": "aot_eager"}, True, True),
        ({"compile": "inductor"}, True, False),
        ({"compile": "none", "optimizer_impl": "compiled"}, True, False),
        ({"compile": "aot_eager", "optimizer_impl": "compiled"}, True, False),  # Inductor's kept, aot_eager's not
        ({"compile": "my_backend"}, False, False),
        ({"compile": "aot_eager_decomp_partition"}, False, False),
    ],
)
def test_the_store_keeps_inductors_graphs_and_aot_eagers_only_where_it_is_the_only_backend(cell, kept, alone):
    """The AOTAutograd cache switches go on for aot_eager alone (torchmatrix.ranks.aot_eager_cache): a
    cell that also compiles with Inductor keeps Inductor's graphs, and a backend of the user's none."""
    assert graphs_kept(cell) is kept and aot_eager_alone(cell) is alone
