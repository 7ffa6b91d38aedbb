"""A matrix whose axes multiply past MAX_CELLS is refused in one line before anything expands;
`--only` prunes its axes before expansion and `-k` reads what is left one cell at a time, so a
narrow selection of a 4 x 10^7-cell product works within a memory limit where expanding it could not."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from torchmatrix.matrix.cells import MAX_CELLS, cell_bound, expand_cells, iter_cells
from torchmatrix.matrix.config import ConfigError, load_matrix
from torchmatrix.matrix.selection import SelectionError

from helpers.checkout import checkout_env
from helpers.matrix_files import write_demo_project

# 4 x 10^7 = 40,000,000 cells
HUGE_AXES = {
    "world_size": [1, 2],
    "fsdp": ["none", "fsdp2"],
    **{f"a{i}": [f"v{i}{j}" for j in range(10)] for i in range(7)},
}
NARROW = {"a0": {"v00"}, "a1": {"v10"}, "a2": {"v20"}, "a3": {"v30"}}  # leaves 4 x 10^3 cells
MEMORY_LIMIT = 1536 * 2**20


@pytest.fixture
def huge(tmp_path):
    return load_matrix(write_demo_project(tmp_path, axes=HUGE_AXES) / "matrix.toml")


def test_streaming_expansion_is_the_expansion():
    axes = {"world_size": [1, 2], "fsdp": ["none", "fsdp2"], "attn": ["sdpa", "flash"]}
    exclude = [{"world_size": 1, "fsdp": "fsdp2"}]
    include = [{"fsdp": "fsdp2", "extra": 1}, {"world_size": 8, "fsdp": "hsdp"}]
    assert list(iter_cells(axes, exclude, include)) == expand_cells(axes, exclude, include)
    assert [c.id for c in expand_cells(axes, exclude, include)][-3:] == [
        "ws2-fsdp2-sdpa-1",
        "ws2-fsdp2-flash-1",
        "ws8-hsdp",
    ]
    assert cell_bound(axes, include) == 10


def test_a_matrix_past_the_cap_is_refused_in_one_line_without_expanding(huge):
    assert cell_bound(huge.axes, huge.include) == 40_000_000 > MAX_CELLS
    with pytest.raises(ConfigError) as refused:
        huge.cells()
    assert "make 40,000,000 cells, over the 200,000 torchmatrix expands" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_k_alone_is_refused_past_what_it_may_read(huge):
    with pytest.raises(SelectionError, match="without --only, this matrix has 40,000,000 cells for -k to read"):
        huge.select(keyword="v35")


def test_only_then_k_select_from_a_huge_matrix(huge):
    kept = huge.select(only=NARROW, keyword="ws2 and v45 and v57")
    assert len(kept) == 2 * 10  # fsdp x a6
    assert all(c["world_size"] == 2 and c["a4"] == "v45" and c["a5"] == "v57" and c["a0"] == "v00" for c in kept)


def test_list_of_one_cell_of_a_huge_matrix_fits_in_a_memory_limit(tmp_path):
    """The issue's case: `list -k <one cell>` of a 4 x 10^7-cell product, here under a 1.5 GiB address
    space limit (expanding it would need about 40 GB)."""
    root = write_demo_project(tmp_path, axes=HUGE_AXES)
    one = "ws2-fsdp2-v00-v10-v20-v30-v41-v52-v63"
    only = [f"--only={axis}={next(iter(values))}" for axis, values in NARROW.items()]
    done = subprocess.run(
        [sys.executable, "-m", "torchmatrix", "list", *only, "-k", one],
        cwd=root,
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT)),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [one]
