"""What the runner, which never imports torch, guesses of the compile store for the ETA: the cells a
test compiled into under the key last used with this torch build, device and matrix."""

from __future__ import annotations

import json
import os
from pathlib import Path

from torchmatrix.messages.compile_store import KEY_FACTS, LAST_USED, LEDGER, cells_with_graphs

DEVICE = {"torch": "2.13.0+cpu", "git_version": "abc", "device_type": "cpu"}
KNOWN = {"matrix": "m1", "device": DEVICE}


def key(root: Path, name: str, facts: dict, compiled: dict[str, float]) -> None:
    """A key folder `name` with `facts`, each cell of `compiled` holding a ledger, last used at the given time."""
    (root / name).mkdir(parents=True)
    (root / name / KEY_FACTS).write_text(json.dumps(facts))
    for cell, used in compiled.items():
        (root / name / cell).mkdir()
        (root / name / cell / LEDGER).write_text("{}")
        (root / name / cell / LAST_USED).write_text("")
        os.utime(root / name / cell / LAST_USED, (used, used))


def test_the_cells_compiled_under_the_key_last_used_with_this_build_device_and_matrix(tmp_path):
    key(tmp_path, "older", {**KNOWN, "sources": "s1"}, {"ws1-a": 1000.0})
    key(tmp_path, "newer", {**KNOWN, "sources": "s2"}, {"ws1-b": 2000.0, "ws2-c": 1500.0})
    key(tmp_path, "other-torch", {**KNOWN, "device": {**DEVICE, "torch": "2.14.1"}}, {"ws1-d": 9000.0})
    key(tmp_path, "other-matrix", {**KNOWN, "matrix": "m2"}, {"ws1-e": 9000.0})
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / KEY_FACTS).write_text("{not json")
    (tmp_path / "newer" / "ws1-f").mkdir()  # a folder without a ledger: nothing compiled there

    cells = ["ws1-a", "ws1-b", "ws2-c", "ws1-d", "ws1-e", "ws1-f", "ws4-g"]
    assert cells_with_graphs(tmp_path, KNOWN, cells) == {"ws1-b", "ws2-c"}
    assert cells_with_graphs(tmp_path / "no-store", KNOWN, cells) == frozenset()
