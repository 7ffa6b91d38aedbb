"""The order a pytest process runs its cells in: a cell about to compile cold under Inductor first, so a
cold run's longest cells do not run alone at the end; once its graphs are in the store, plan order."""

from __future__ import annotations

import platform
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.plan import run_key
from torchmatrix.ranks.compile_ledger import compile_seconds_saved, has_compiled
from torchmatrix.ranks.plugin import CellPlan
from torchmatrix.ranks.run_order import running_order

from helpers.matrix_files import matrix_toml


def _cell(name: str) -> Cell:
    return Cell({"variant": name})  # its id is `name`


def test_cells_that_compile_cold_go_first_and_each_part_keeps_plan_order():
    eager, cold, warm, later_cold = _cell("eager"), _cell("cold"), _cell("warm"), _cell("later-cold")
    runs = [("a", eager), ("b", eager), ("a", cold), ("a", warm), ("b", cold), ("a", later_cold)]
    places = running_order(runs, lambda cell: cell.id in {"cold", "later-cold"})
    ordered = sorted(places, key=places.get)
    assert ordered == [
        run_key("a", "cold"),
        run_key("b", "cold"),
        run_key("a", "later-cold"),
        run_key("a", "eager"),
        run_key("b", "eager"),
        run_key("a", "warm"),
    ]
    assert running_order(runs, lambda cell: False) == {run_key(s, c.id): i for i, (s, c) in enumerate(runs)}
    asked = []
    running_order(runs, lambda cell: asked.append(cell.id) or False)
    assert sorted(asked) == sorted({"eager", "cold", "warm", "later-cold"}), "each cell's store is read once"


def test_a_cell_has_compiled_once_a_test_recorded_its_cold_compile(tmp_path):
    folder = tmp_path / "ws1-inductor"
    assert not has_compiled(folder)
    folder.mkdir()
    assert not has_compiled(folder), "a folder made for the cell (its last-used stamp) holds no graph yet"
    assert compile_seconds_saved(folder, "suite::test", 3.0) is None
    assert has_compiled(folder)


def test_a_launched_rank_never_moves_a_cell_since_every_rank_must_keep_one_order(tmp_path):
    """Ranks that torchrun or srun started each decide on their own node, whose store may hold the cell's
    graphs where another's does not: a cell moved on one rank only would pair different tests' collectives."""
    inductor = Cell({"world_size": 2, "compile": "inductor"})
    local = SimpleNamespace(plan=SimpleNamespace(launched=False), compile_caches=tmp_path)
    launched = SimpleNamespace(plan=SimpleNamespace(launched=True), compile_caches=tmp_path)
    assert CellPlan.compiles_cold(local, inductor)
    assert CellPlan.compiles_cold(local, Cell({"world_size": 2, "compile": "aot_eager"})), "the store keeps its graphs"
    assert not CellPlan.compiles_cold(local, Cell({"world_size": 2, "compile": "aot_eager_decomp_partition"})), (
        "a backend whose graphs the store does not keep costs the same warm: it keeps its place"
    )
    assert not CellPlan.compiles_cold(launched, inductor)


SUITE = """
import os

import torch


def _compile():
    return torch.compile(lambda x: (x * 3).cos() + x)(torch.arange(4.0)).sum().item()


def test_runs(cell, ranks):
    with open(os.environ["ORDER_OUT"], "a") as out:
        out.write(cell.id + "\\n")
    if cell["compile"] == "inductor":
        ranks.run(_compile)
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.machine() != "x86_64" or not shutil.which("g++"),
    reason="Inductor's on-disk caches need its CPU backend: x86-64 Linux with a C++ compiler",
)
def test_an_inductor_cell_runs_first_while_cold_and_in_plan_order_once_warm(project, tmp_path, monkeypatch):
    order, store = tmp_path / "order.txt", tmp_path / "store"
    monkeypatch.setenv("ORDER_OUT", str(order))
    project.write_suites(
        matrix_toml(axes={"world_size": [1], "compile": ["none", "inductor"]}, suites={"order": {}}), test_order=SUITE
    )

    def ran(run_id: str) -> list[str]:
        order.unlink(missing_ok=True)
        done = project.torchmatrix(
            "run",
            "--torch",
            "system",
            "--reports",
            "out",
            "--run-id",
            run_id,
            "--compile-cache",
            str(store),
            "--slots",
            "1",  # one pytest process runs both cells
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return Path(order).read_text().split()

    assert ran("cold") == ["ws1-inductor", "ws1-none"], "a cold Inductor cell runs before the eager one"
    assert ran("warm") == ["ws1-none", "ws1-inductor"], "with its graphs in the store the cell keeps plan order"
