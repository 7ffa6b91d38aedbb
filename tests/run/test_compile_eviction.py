"""The compile store's size cap: whole cell folders go, least recently used first, until the store
fits; a folder used since the run started or within the last hour stays whatever the cap, and a key
folder goes with its last cell."""

from __future__ import annotations

import os
import time

from torchmatrix.messages.compile_store import LAST_USED
from torchmatrix.run.compile_eviction import evict

MB = 2**20


def _cell(root, key, cell, megabytes, used_hours_ago):
    folder = root / key / cell / "rank0"
    folder.mkdir(parents=True)
    (folder / "graph").write_bytes(b"\0" * (megabytes * MB))
    stamp = root / key / cell / LAST_USED
    stamp.touch()
    when = time.time() - used_hours_ago * 3600
    os.utime(stamp, (when, when))
    return root / key / cell


def test_the_least_recently_used_cells_go_until_the_store_fits(tmp_path):
    oldest = _cell(tmp_path, "k1", "ws1-a", 3, used_hours_ago=48)
    older = _cell(tmp_path, "k1", "ws2-a", 3, used_hours_ago=24)
    newer = _cell(tmp_path, "k2", "ws1-a", 3, used_hours_ago=2)
    (tmp_path / "k1" / ".vec-isa-probe").mkdir()
    evicted = evict(tmp_path, 4 * MB, spare_since=time.time())
    assert (evicted.removed_cells, evicted.kept_bytes) == (2, 3 * MB)
    assert not oldest.exists() and not older.exists() and newer.exists()
    assert not (tmp_path / "k1").exists(), "a key folder without cells stayed"


def test_a_cell_used_by_this_run_or_in_the_last_hour_stays_over_the_cap(tmp_path):
    started = time.time() - 7200
    by_this_run = _cell(tmp_path, "k1", "ws1-a", 2, used_hours_ago=1.5)
    recently = _cell(tmp_path, "k1", "ws2-a", 2, used_hours_ago=0.5)
    evicted = evict(tmp_path, 1 * MB, spare_since=started)
    assert evicted.removed_cells == 0 and by_this_run.exists() and recently.exists()
    assert evicted.kept_bytes == 4 * MB


def test_a_store_within_its_cap_or_missing_is_left_as_it_is(tmp_path):
    cell = _cell(tmp_path, "k1", "ws1-a", 1, used_hours_ago=100)
    assert evict(tmp_path, 2 * MB, spare_since=time.time()).removed_cells == 0 and cell.exists()
    assert evict(tmp_path / "absent", 0, spare_since=time.time()).kept_bytes == 0
