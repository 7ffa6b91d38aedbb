"""Planning: one suite run per distinct value of the suite's axes, and groups that fill the slots."""

from __future__ import annotations

import pytest

from torchmatrix.matrix.cells import expand_cells
from torchmatrix.matrix.config import Suite
from torchmatrix.matrix.plan import group_runs, plan_runs

CELLS = expand_cells(
    {
        "world_size": [1, 2, 4],
        "fsdp": ["none", "fsdp1", "fsdp2"],
        "attn": ["sdpa", "eager"],
        "optimizer": ["adamw", "pa"],
    },
    exclude=[{"fsdp": "none", "world_size": [2, 4]}],
)
SUITES = {
    "collectives": Suite("collectives", "suites/a.py", 60, ("world_size",)),
    "grad_ckpt": Suite("grad_ckpt", "suites/g.py", 60, ("world_size", "fsdp", "attn")),
    "resume": Suite("resume", "suites/r.py", 60, ("world_size", "fsdp", "attn", "optimizer")),
}


def test_a_suite_runs_once_per_distinct_value_of_its_axes():
    runs = plan_runs(CELLS, SUITES)
    per_suite = {name: [r for r in runs if r.suite.name == name] for name in SUITES}
    assert len(per_suite["collectives"]) == 3
    assert len(per_suite["grad_ckpt"]) == len(CELLS) // 2, "optimizer does not matter to grad_ckpt"
    assert len(per_suite["resume"]) == len(CELLS)
    for name, suite_runs in per_suite.items():
        covered = [cell for run in suite_runs for cell in run.covers]
        assert sorted(c.id for c in covered) == sorted(c.id for c in CELLS), f"{name}: every cell covered exactly once"
        for run in suite_runs:
            assert run.cell == run.covers[0]
            assert all(c.world_size == run.cell.world_size for c in run.covers)


@pytest.mark.parametrize("slots", [1, 2, 3, 8, 64])
def test_groups_fill_the_slots_and_keep_cells_whole(slots):
    runs = plan_runs(CELLS, SUITES)
    groups = group_runs(runs, slots)
    assert sorted(r.key for g in groups for r in g.runs) == sorted(r.key for r in runs)
    for size in (1, 2, 4):
        mine = [g for g in groups if g.world_size == size]
        assert 1 <= len(mine) <= max(1, slots // size)
        owners = {}
        for group in mine:
            for run in group.runs:
                assert run.cell.world_size == size
                assert owners.setdefault(run.cell, group.name) == group.name, "a cell's runs stay in one process"
    assert [g.world_size for g in groups] == sorted((g.world_size for g in groups), reverse=True), "widest first"
    assert len({g.name for g in groups}) == len(groups)


def test_two_slots_split_world_size_one_in_two_balanced_processes():
    groups = [g for g in group_runs(plan_runs(CELLS, SUITES), 2) if g.world_size == 1]
    assert [g.name for g in groups] == ["ws1-1", "ws1-2"]
    sizes = [len(g.runs) for g in groups]
    assert abs(sizes[0] - sizes[1]) <= 4, sizes


@pytest.mark.parametrize(
    "slots, expected",
    [
        (2, ["ws4", "ws2", "ws1"]),
        (4, ["ws4", "ws2", "ws1"]),
        (8, ["ws4-1", "ws4-2", "ws2", "ws1"]),
        (16, ["ws4-1", "ws4-2", "ws4-3", "ws4-4", "ws2", "ws1"]),
    ],
)
def test_with_fillers_a_world_size_splits_only_over_the_slots_wider_ones_left(slots, expected):
    """On CPU every group starts at once and those beyond the cores fill idle cycles, so splitting
    a world size whose groups would all be fillers only adds processes (and torch imports)."""
    groups = group_runs(plan_runs(CELLS, SUITES), slots, fillers=True)
    assert [g.name for g in groups] == expected
