"""The compile store: a second run finds the graphs the first compiled and says what that saved, and
a cached entry is read only under its own key. The proof plants, in every cache entry folder of one
cell, an entry whose unpickling writes down who read it: the cell's own later run reads it (so a
plant is seen when the key matches), another world size and a changed suite source never do."""

from __future__ import annotations

import json
import pickle
import platform
import shutil
import sys
from pathlib import Path

import pytest
from junitparser import JUnitXml

from helpers.matrix_files import matrix_toml

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or platform.machine() != "x86_64" or not shutil.which("g++"),
        reason="Inductor's on-disk caches need its CPU backend: x86-64 Linux with a C++ compiler",
    ),
]

SUITE = """
import json, os

import torch


def _compile():
    from torch._dynamo.utils import counters

    value = torch.compile(lambda x: (x * 3).cos() + x)(torch.arange(4.0)).sum().item()
    return {"folder": os.environ["TORCHINDUCTOR_CACHE_DIR"], "hits": counters["inductor"]["fxgraph_cache_hit"], "value": value}


def test_compiles(cell, ranks):
    with open(os.path.join(os.environ["STORE_OUT"], cell.id + ".json"), "w") as out:
        json.dump(ranks.run(_compile), out)
"""


class _Reader:
    """A planted cache entry: unpickling it appends the reader's cache folder to `log`, then raises, so
    that Inductor, as with any entry it cannot load, warns and goes on to the real one."""

    def __init__(self, log: Path):
        self.log = log

    def __reduce__(self):
        code = f"import os; open({str(self.log)!r}, 'a').write(os.environ['TORCHINDUCTOR_CACHE_DIR'] + '\\n'); raise RuntimeError('planted')"
        return exec, (code,)


def _plant(cell_folder: Path, log: Path) -> int:
    """Put a reader first in every folder of the cell that holds Inductor's cache entries."""
    entry_folders = {entry.parent for entry in cell_folder.glob("rank*/fxgraph/*/*/*") if entry.is_file()}
    entry_folders |= {entry.parent for entry in cell_folder.glob("rank*/aotautograd/*/*") if entry.is_file()}
    for folder in entry_folders:
        (folder / "!planted").write_bytes(pickle.dumps(_Reader(log)))
    return len(entry_folders)


def _seen(out: Path, cell: str) -> list[dict]:
    return json.loads((out / f"{cell}.json").read_text())


def _properties(project, run_id: str) -> dict[str, str]:
    found = {}
    for suite in JUnitXml.fromfile(str(project.root / "out" / run_id / "junit.xml")):
        found.update({prop.name: prop.value for prop in suite.properties()})
    return found


def test_a_cached_graph_is_read_again_under_its_key_and_never_across_a_world_size_or_a_changed_source(
    project, tmp_path, monkeypatch
):
    out, store, readers = tmp_path / "seen", tmp_path / "store", tmp_path / "readers.log"
    out.mkdir()
    monkeypatch.setenv("STORE_OUT", str(out))
    project.write_suites(
        matrix_toml(axes={"world_size": [1, 2], "compile": ["inductor"]}, suites={"store": {}}), test_store=SUITE
    )

    def run(run_id: str, *only: str):
        done = project.torchmatrix(
            "run", "--torch", "system", "--reports", "out", "--run-id", run_id, "--compile-cache", str(store), *only
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    run("cold")
    (key,) = [folder for folder in store.iterdir() if folder.is_dir()]
    first = {cell: _seen(out, cell) for cell in ("ws1-inductor", "ws2-inductor")}
    assert [rank["folder"] for rank in first["ws2-inductor"]] == [
        str(key / "ws2-inductor" / f"rank{r}") for r in (0, 1)
    ]
    assert all(rank["hits"] == 0 for ranks in first.values() for rank in ranks), first
    assert json.loads((key / "key.json").read_text())["torch"], "the key's facts are written beside its cells"
    assert _plant(key / "ws1-inductor", readers), "the cold run cached no entry to plant beside"

    warm = run("warm")
    again = {cell: _seen(out, cell) for cell in ("ws1-inductor", "ws2-inductor")}
    assert again["ws2-inductor"][0]["hits"] > 0, f"the second run compiled ws2 afresh: {again['ws2-inductor']}"
    assert [rank["value"] for rank in again["ws2-inductor"]] == [rank["value"] for rank in first["ws2-inductor"]]
    read_by = set(readers.read_text().split())
    assert read_by == {str(key / "ws1-inductor" / "rank0")}, f"a planted ws1 entry was read by {read_by}"
    saved = _properties(project, "warm")
    assert float(saved["store::test_compiles::compile_seconds_saved"]) > 0, saved
    summary = project.torchmatrix("report", "out/warm")
    assert summary.returncode == 0, summary.stdout + summary.stderr
    assert "saved by the compile cache" in (project.root / "out" / "warm" / "summary.md").read_text(), warm.stdout

    readers.unlink()
    project.write("suites/test_store.py", SUITE + "\n# an edit: the key's sources change\n")
    run("edited", "--only", "world_size=1")
    assert not readers.exists(), f"a planted entry was read after the suite changed: {readers.read_text()}"
    (edited,) = _seen(out, "ws1-inductor")
    assert Path(edited["folder"]).parent.parent != key and edited["hits"] == 0, edited
