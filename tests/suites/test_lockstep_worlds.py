"""parallel_equivalence's passes land in the right worlds: the single-process reference in a world of
one rank of its own, the cell's training in the cell's; where a launcher fixed the world, the
reference runs on every rank of the cell's world instead, and every record says which it was."""

from __future__ import annotations

from suites.references.lockstep import IN_THE_CELLS_WORLD, OWN_WORLD, lockstep_records
from suites.references.lockstep_steps import LockstepRecord
from torchmatrix.matrix.cells import Cell
from torchmatrix.ranks.cell_ranks import Ranks
from torchmatrix.ranks.launched import LaunchedRank

CELL = {"world_size": 2, "fsdp": "fsdp2", "mesh": "flat", "optimizer": "adamw"}
ANSWERS = {
    "open_single_process": {"max_norm": 0.5},
    "train_cell": {"shards": 2, "tensor_parallel": False},
    "compare_in_lockstep": [LockstepRecord(2, False, [], [], 0, 0.5, 0.0, 0.0)] * 2,
}


class AnsweringPool:
    """A rank group that records which rank function each run sends and answers it as a rank would."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.functions = []

    def run(self, fn, args, *, deadline, name):
        function = args[1].__name__
        self.functions.append(function)
        return [ANSWERS[function]] * self.world_size


def test_the_reference_runs_in_a_world_of_one_rank_beside_the_cells(tmp_path):
    cell_pool, own_pool = AnsweringPool(2), AnsweringPool(1)
    ranks = Ranks(cell_pool, Cell({"world_size": 2}), 60, str(tmp_path), lambda size: own_pool)
    records = lockstep_records(ranks, CELL, None, {}, tmp_path)
    assert own_pool.functions == ["open_single_process", "compare_in_lockstep"]
    assert cell_pool.functions == ["train_cell"]
    assert [record.reference_world for record in records] == [OWN_WORLD, OWN_WORLD]


def test_where_a_launcher_fixed_the_world_the_reference_runs_in_the_cells_and_says_so(tmp_path):
    def launched(size):
        return LaunchedRank(2, backend="gloo", collective_timeout_s=60).of_size(size)

    cell_pool = AnsweringPool(2)
    records = lockstep_records(
        Ranks(cell_pool, Cell({"world_size": 2}), 60, str(tmp_path), launched), CELL, None, {}, tmp_path
    )
    assert cell_pool.functions == ["open_single_process", "train_cell", "compare_in_lockstep"]
    said = IN_THE_CELLS_WORLD.format(
        why_not="ranks started by a launcher (torchrun, srun) cannot open a world of 1 of their own: the launcher "
        "fixed the world at 2"
    )
    assert [record.reference_world for record in records] == [said, said]
