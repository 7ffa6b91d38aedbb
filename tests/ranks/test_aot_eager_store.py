"""aot_eager's graphs in the compile store: a cell that compiles with aot_eager alone finds its forward
and backward graphs again in the next run and trains to the same gradients, while the rank that serves
it turns torch's switches off again for the next cell, so an Inductor cell's graphs stay as torch caches
them and another backend's are never put in the store."""

from __future__ import annotations

import json
import platform
import shutil
import sys

import pytest

from helpers.matrix_files import matrix_toml

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or platform.machine() != "x86_64" or not shutil.which("g++"),
        reason="the Inductor cell needs Inductor's CPU backend: x86-64 Linux with a C++ compiler",
    ),
]

SUITE = """
import json, os

import torch


def _compile(backend):
    import torch._functorch.config as config
    from torch._dynamo.utils import counters

    before = counters["aot_autograd"]["autograd_cache_hit"]  # the rank's count so far, over every cell
    x = torch.arange(4.0, requires_grad=True)
    torch.compile(lambda t: (t * 3).cos() * t, backend=backend)(x).sum().backward()
    return {
        "switches": [config.force_autograd_cache, config.bundled_autograd_cache],
        "hits": counters["aot_autograd"]["autograd_cache_hit"] - before,
        "grad": x.grad.tolist(),
        "pid": os.getpid(),
    }


def test_compiles(cell, ranks):
    with open(os.path.join(os.environ["STORE_OUT"], cell.id + ".json"), "w") as out:
        json.dump(ranks.run(_compile, cell["compile"])[0], out)
"""

CELLS = ("aot_eager", "inductor", "aot_eager_decomp_partition")


def test_an_aot_eager_cell_reads_its_graphs_back_and_no_other_cell_keeps_them_so(project, tmp_path, monkeypatch):
    out, store = tmp_path / "seen", tmp_path / "store"
    out.mkdir()
    monkeypatch.setenv("STORE_OUT", str(out))
    project.write_suites(matrix_toml(axes={"compile": list(CELLS)}, suites={"store": {}}), test_store=SUITE)

    def run(run_id: str) -> dict[str, dict]:
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
            "1",
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return {cell: json.loads((out / f"{cell}.json").read_text()) for cell in CELLS}

    cold = run("cold")
    assert len({seen["pid"] for seen in cold.values()}) == 1, "one rank process served the three cells in turn"
    assert {cell: seen["switches"] for cell, seen in cold.items()} == {
        "aot_eager": [True, True],
        "inductor": [False, False],
        "aot_eager_decomp_partition": [False, False],
    }, "the switches are on for the aot_eager cell alone, and off again for the cells after it"
    assert cold["aot_eager"]["hits"] == 0
    (key,) = [folder for folder in store.iterdir() if folder.is_dir()]
    assert list((key / "aot_eager" / "rank0").glob("aotautograd/*/*")), "the cold run kept no aot_eager graph"
    assert not list((key / "aot_eager_decomp_partition").glob("rank0/aotautograd/*/*")), (
        "a backend the store does not keep left graphs in it"
    )

    warm = run("warm")
    assert warm["aot_eager"]["hits"] > 0, f"the aot_eager cell compiled afresh: {warm['aot_eager']}"
    assert warm["aot_eager"]["grad"] == cold["aot_eager"]["grad"], "the graph read back trained otherwise"
    assert warm["aot_eager_decomp_partition"]["hits"] == 0, "another backend's graphs came from the store"
