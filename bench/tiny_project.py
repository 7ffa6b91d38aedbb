"""The throwaway project every bench's --tiny mode runs: one trivial distributed suite over a
world size or two, so that CI runs each bench in seconds and a bench that no longer runs fails."""

from __future__ import annotations

from pathlib import Path

SUITE = """
import torch
import torch.distributed as dist


def _all_reduce_one():
    value = torch.ones(1)
    dist.all_reduce(value)
    return value.item()


def test_all_reduce(cell, ranks):
    assert ranks.run(_all_reduce_one) == [float(cell.world_size)] * cell.world_size
"""


def write_tiny_project(
    root: Path, world_sizes: tuple[int, ...] = (1, 2), versions: tuple[str, ...] = ("system",)
) -> Path:
    """A project at `root` (matrix.toml and suites/test_tiny.py); returns its matrix.toml."""
    (root / "suites").mkdir(parents=True, exist_ok=True)
    (root / "suites" / "test_tiny.py").write_text(SUITE)
    listed = ", ".join(f'"{version}"' for version in versions)
    matrix = root / "matrix.toml"
    matrix.write_text(
        f"[torch]\nversions = [{listed}]\n\n[axes]\nworld_size = {list(world_sizes)}\n\n"
        '[suites.tiny]\npath = "suites/test_tiny.py"\ntimeout = 120\n'
    )
    return matrix
