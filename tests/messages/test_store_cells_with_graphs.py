"""What the runner, which never imports torch, reads of the compile store for the ETA: the folder its
ranks will compile into, named without making it, and the cells a test compiled into there."""

from __future__ import annotations

from torchmatrix.messages.compile_store import KEY_FACTS, LEDGER, cells_with_graphs, key_folder, key_folder_of

FACTS = {"torch": "2.13.0+cpu", "sources": "s1", "device": {"device_type": "cpu"}, "matrix": "m1"}


def test_the_key_folder_is_named_without_being_made_and_its_cells_with_a_ledger_have_graphs(tmp_path):
    named = key_folder_of(tmp_path, FACTS)
    assert not named.exists(), "naming the folder makes nothing"
    assert key_folder(tmp_path, dict(reversed(FACTS.items()))) == named and (named / KEY_FACTS).is_file()
    assert key_folder_of(tmp_path, {**FACTS, "sources": "s2"}) != named, "a changed source is another key"

    for cell in ("ws1-a", "ws2-b"):
        (named / cell).mkdir()
    (named / "ws1-a" / LEDGER).write_text("{}")  # ws2-b's folder holds no ledger: nothing compiled there
    assert cells_with_graphs(named, ["ws1-a", "ws2-b", "ws4-c"]) == {"ws1-a"}
    assert cells_with_graphs(tmp_path / "no-store" / "key", ["ws1-a"]) == frozenset()
