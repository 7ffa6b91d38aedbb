"""`CellSelection`: the flags parsed once, and spelled back as flags that select the same cells."""

from __future__ import annotations

import argparse

import pytest

from torchmatrix.matrix.cells import expand_cells
from torchmatrix.matrix.selection import EVERY_CELL, CellSelection, SelectionError, Shard, select_cells

AXES = {"world_size": [1, 2, 4, 10], "fsdp": ["none", "fsdp1", "fsdp2"], "attn": ["sdpa", "eager"]}
MATRIX = expand_cells(AXES)


def selected(selection: CellSelection) -> list[str]:
    return [c.id for c in select_cells(MATRIX, only=selection.only, keyword=selection.keyword, shard=selection.shard)]


def reparsed(selection: CellSelection) -> CellSelection:
    """What a job or step gets from `selection.arguments()`, parsed as `torchmatrix run` parses them."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("-k", dest="keyword")
    parser.add_argument("--shard")
    args = parser.parse_args(selection.arguments())
    return CellSelection.parse(args.only, args.keyword, args.shard, AXES)


@pytest.mark.parametrize(
    "only, keyword, shard",
    [
        ([], None, None),
        (["world_size=10,2", " attn = eager , sdpa"], None, None),
        (["fsdp=fsdp1,fsdp2", "fsdp=fsdp2,none"], "not ws4 and (sdpa or eager)", None),
        ([], "ws1 or ws10", "2/3"),
    ],
)
def test_the_arguments_select_what_the_selection_does(only, keyword, shard):
    selection = CellSelection.parse(only, keyword, shard, AXES)
    assert reparsed(selection) == selection
    assert selected(reparsed(selection)) == selected(selection)


def test_arguments_that_drop_a_filter_are_caught():
    selection = CellSelection.parse(["fsdp=fsdp2"], "ws2", None, AXES)
    without_keyword = CellSelection.parse(["fsdp=fsdp2"], None, None, AXES)
    assert reparsed(without_keyword) != selection
    assert selected(without_keyword) != selected(selection)


def test_the_arguments_spell_values_in_natural_order():
    selection = CellSelection.parse(["world_size=10,2,1"], "fsdp2", "1/2", AXES)
    assert selection.arguments() == ["--only=world_size=1,2,10", "-k", "fsdp2", "--shard", "1/2"]
    assert EVERY_CELL.arguments() == []


def test_exactly_selects_those_cells():
    cells = [c for c in MATRIX if c.world_size == 2 and c["attn"] == "eager"]
    assert selected(CellSelection.exactly(cells, among=MATRIX)) == [c.id for c in cells]


def test_exactly_leaves_out_a_longer_id_that_contains_a_chosen_one():
    """ws1-adamw is inside ws1-adamw_fused: choosing the first must not bring the second along."""
    matrix = expand_cells({"world_size": [1], "optimizer": ["adamw", "adamw_fused"]})
    ids = [c.id for c in matrix]
    plain = [c for c in matrix if c["optimizer"] == "adamw"]
    assert any(plain[0].id in other for other in ids if other != plain[0].id), ids
    only_plain = CellSelection.exactly(plain, among=matrix)
    assert [c.id for c in select_cells(matrix, keyword=only_plain.keyword)] == [plain[0].id]
    assert [c.id for c in select_cells(matrix, keyword=CellSelection.exactly(matrix, among=matrix).keyword)] == ids


def test_sharded_keeps_the_filters_and_slices_what_they_keep():
    selection = CellSelection.parse(["fsdp=fsdp2"], None, None, AXES)
    shards = [selected(selection.sharded(Shard(i, 2))) for i in (1, 2)]
    assert sorted(shards[0] + shards[1]) == sorted(selected(selection))
    assert selection.shard is None


def test_the_selection_is_read_only():
    selection = CellSelection.parse(["fsdp=fsdp2"], None, None, AXES)
    with pytest.raises(TypeError):
        selection.only["attn"] = frozenset({"sdpa"})
    assert not EVERY_CELL.narrows and selection.narrows


def test_a_bad_flag_is_refused_while_parsing():
    with pytest.raises(SelectionError, match="not an axis"):
        CellSelection.parse(["mesh=flat"], None, None, AXES)
    with pytest.raises(SelectionError, match="i/n"):
        CellSelection.parse([], None, "2", AXES)
