"""The full lane's start order (tests/helpers/start_order.py): the files it names exist, and they
start first, in its order, then the other slow tests, then the fast ones."""

from __future__ import annotations

from types import SimpleNamespace

from helpers.start_order import LONGEST_FIRST, TESTS, expected_cost_rank


def item(relative: str, slow: bool) -> SimpleNamespace:
    """What expected_cost_rank reads of a collected test: its file and its slow marker."""
    return SimpleNamespace(path=TESTS / relative, get_closest_marker=lambda name: slow and name == "slow")


def test_every_file_it_names_exists():
    missing = [relative for relative in LONGEST_FIRST if not (TESTS / relative).is_file()]
    assert not missing, f"LONGEST_FIRST names files that do not exist (renamed?): {missing}"


def test_the_longest_files_start_first_then_slow_then_fast():
    tests = [
        item("test_layers.py", False),
        item("run/test_run_e2e.py", True),
        *(item(relative, True) for relative in LONGEST_FIRST[2::-1]),
    ]
    ranks = [expected_cost_rank(test) for test in tests]
    assert sorted(ranks) == [0, 1, 2, len(LONGEST_FIRST), len(LONGEST_FIRST) + 1], ranks
    assert ranks[0] > ranks[1] > max(ranks[2:]), "fast after slow, both after the longest files"


def test_a_file_it_does_not_name_starts_after_them():
    """What a renamed or new file gets: the slow/fast order after the named files, never a named file's place."""
    assert expected_cost_rank(item("no_such_dir/test_nothing.py", True)) == len(LONGEST_FIRST)
