"""Cell expansion with GitHub Actions matrix semantics, ids, filters and shards."""

from __future__ import annotations

import pickle

import pytest

from torchmatrix.matrix.cells import Cell, expand_cells
from torchmatrix.matrix.selection import KeywordExpression, SelectionError, Shard, parse_only, select_cells


def as_dicts(cells):
    return [dict(c) for c in cells]


def test_github_docs_include_example():
    """The "Expanding or adding matrix configurations" example of the GitHub Actions docs."""
    cells = expand_cells(
        {"fruit": ["apple", "pear"], "animal": ["cat", "dog"]},
        include=[
            {"color": "green"},
            {"color": "pink", "animal": "cat"},
            {"fruit": "apple", "shape": "circle"},
            {"fruit": "banana"},
            {"fruit": "banana", "animal": "cat"},
        ],
    )
    assert as_dicts(cells) == [
        {"fruit": "apple", "animal": "cat", "color": "pink", "shape": "circle"},
        {"fruit": "apple", "animal": "dog", "color": "green", "shape": "circle"},
        {"fruit": "pear", "animal": "cat", "color": "pink"},
        {"fruit": "pear", "animal": "dog", "color": "green"},
        {"fruit": "banana"},
        {"fruit": "banana", "animal": "cat"},
    ]


def test_github_docs_exclude_example():
    """The "Excluding matrix configurations" example: partial matches remove cells."""
    cells = expand_cells(
        {"os": ["macos-latest", "windows-latest"], "version": [12, 14, 16], "environment": ["staging", "production"]},
        exclude=[
            {"os": "macos-latest", "version": 12, "environment": "production"},
            {"os": "windows-latest", "version": 16},
        ],
    )
    assert len(cells) == 12 - 1 - 2
    assert {"os": "macos-latest", "version": 12, "environment": "production"} not in as_dicts(cells)
    assert not [c for c in cells if c["os"] == "windows-latest" and c["version"] == 16]


def test_github_docs_include_extends_single_axis():
    """The docs' example where an include adds a key to every matching original combination."""
    cells = expand_cells(
        {"os": ["windows-latest", "ubuntu-latest"], "node": [14, 16]},
        include=[{"os": "windows-latest", "node": 16, "npm": 6}],
    )
    assert as_dicts(cells) == [
        {"os": "windows-latest", "node": 14},
        {"os": "windows-latest", "node": 16, "npm": 6},
        {"os": "ubuntu-latest", "node": 14},
        {"os": "ubuntu-latest", "node": 16},
    ]


def test_includes_apply_after_excludes():
    cells = expand_cells(
        {"world_size": [1, 2], "fsdp": ["none", "fsdp2"]},
        exclude=[{"fsdp": "none", "world_size": [2]}],
        include=[{"world_size": 2, "fsdp": "none"}],
    )
    assert [c.id for c in cells] == ["ws1-none", "ws1-fsdp2", "ws2-fsdp2", "ws2-none"]


def test_include_with_new_value_becomes_a_new_cell():
    cells = expand_cells(
        {"world_size": [2], "optimizer": ["adamw"]}, include=[{"world_size": 2, "optimizer": "te_fused_adam"}]
    )
    assert [c.id for c in cells] == ["ws2-adamw", "ws2-te_fused_adam"]


def test_ids_are_stable_and_filename_safe():
    cell = Cell({"world_size": 2, "fsdp": "fsdp2", "attn": "sdpa", "optimizer": "adamw", "compile": False})
    assert cell.id == "ws2-fsdp2-sdpa-adamw-no_compile"
    assert Cell(dict(cell)).id == cell.id
    assert pickle.loads(pickle.dumps(cell)) == cell
    assert "/" not in cell.id and " " not in cell.id
    assert cell.world_size == 2
    with pytest.raises(AttributeError):
        cell.x = 1


def test_cell_without_world_size_runs_on_one_rank():
    assert Cell({"fruit": "banana"}).world_size == 1


MATRIX = expand_cells(
    {"world_size": [1, 2, 4], "fsdp": ["none", "fsdp1", "fsdp2"], "attn": ["sdpa", "eager"]},
    exclude=[{"fsdp": "none", "world_size": [2, 4]}],
)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 7, 16, 40])
def test_shards_partition_the_matrix(count):
    shards = [select_cells(MATRIX, shard=Shard(i, count)) for i in range(1, count + 1)]
    ids = [c.id for shard in shards for c in shard]
    assert sorted(ids) == sorted(c.id for c in MATRIX), "union of shards must be the whole matrix, each cell once"
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1, sizes
    assert shards == [select_cells(MATRIX, shard=Shard(i, count)) for i in range(1, count + 1)], "deterministic"


def test_shards_keep_world_sizes_together():
    shards = [select_cells(MATRIX, shard=Shard(i, 3)) for i in (1, 2, 3)]
    assert [sorted({c.world_size for c in s}) for s in shards] == [[1], [1, 2], [4]]


def test_shard_of_filtered_cells_partitions_the_filtered_set():
    only = parse_only(["fsdp=fsdp1,fsdp2"], {"world_size": [], "fsdp": [], "attn": []})
    kept = select_cells(MATRIX, only=only)
    union = [c for i in (1, 2) for c in select_cells(MATRIX, only=only, shard=Shard(i, 2))]
    assert sorted(c.id for c in union) == sorted(c.id for c in kept)


@pytest.mark.parametrize("text", ["0/2", "3/2", "1-2", "a/b", "1/0"])
def test_bad_shards_say_how_to_write_them(text):
    with pytest.raises(SelectionError, match="i/n|between 1 and n"):
        Shard.parse(text)


def test_only_filters_and_across_axes_or_within():
    axes = {"world_size": [1, 2, 4], "fsdp": [], "attn": []}
    chosen = select_cells(MATRIX, only=parse_only(["world_size=2,4", "attn=eager"], axes))
    assert {c.world_size for c in chosen} == {2, 4}
    assert {c["attn"] for c in chosen} == {"eager"}
    assert len(chosen) == 4


@pytest.mark.parametrize("text", ["fsdp", "nope=1", "fsdp="])
def test_bad_only_is_a_selection_error(text):
    with pytest.raises(SelectionError):
        parse_only([text], {"fsdp": []})


@pytest.mark.parametrize(
    "expression, expected",
    [
        (
            "fsdp2",
            [
                "ws1-fsdp2-sdpa",
                "ws1-fsdp2-eager",
                "ws2-fsdp2-sdpa",
                "ws2-fsdp2-eager",
                "ws4-fsdp2-sdpa",
                "ws4-fsdp2-eager",
            ],
        ),
        ("fsdp2 and not ws4 and eager", ["ws1-fsdp2-eager", "ws2-fsdp2-eager"]),
        ("none or (ws4 and fsdp1 and sdpa)", ["ws1-none-sdpa", "ws1-none-eager", "ws4-fsdp1-sdpa"]),
        ("not (ws1 or ws2)", [c.id for c in MATRIX if c.world_size == 4]),
    ],
)
def test_keyword_expressions(expression, expected):
    assert [c.id for c in select_cells(MATRIX, keyword=expression)] == expected


@pytest.mark.parametrize("text", ["", "fsdp2 and", "(fsdp2", "and fsdp2", "fsdp2 )"])
def test_bad_keyword_expressions(text):
    with pytest.raises(SelectionError):
        KeywordExpression(text)
