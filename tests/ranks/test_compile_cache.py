"""Compiled kernels never cross cells or ranks: each rank of each (suite, cell) run compiles into
its own TORCHINDUCTOR_CACHE_DIR, even when one long-lived rank process serves both cells, and
Inductor itself (which reads the variable at each cache access) sees that directory."""

from __future__ import annotations

import json

import pytest

from conftest import matrix_toml

pytestmark = pytest.mark.slow

SUITE = """
import json, os

import torch.distributed as dist


def _where():
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return {"rank": dist.get_rank(), "pid": os.getpid(), "inductor": cache_dir(), "env": os.environ["TORCHINDUCTOR_CACHE_DIR"]}


def test_where_kernels_are_cached(cell, ranks):
    seen = ranks.run(_where)
    with open(os.path.join(os.environ["COMPILE_CACHE_OUT"], cell.id + ".json"), "w") as out:
        json.dump(seen, out)
"""


def test_each_cell_compiles_into_its_own_cache_directory(project, tmp_path, monkeypatch):
    out = tmp_path / "seen"
    out.mkdir()
    monkeypatch.setenv("COMPILE_CACHE_OUT", str(out))
    project.write("matrix.toml", matrix_toml(axes={"world_size": [2], "flavor": ["a", "b"]}, suites={"where": {}}))
    project.write("suites/__init__.py", "")
    project.write("suites/test_where.py", SUITE)
    done = project.torchmatrix("run", "--torch", "system", "--reports", "out", "--slots", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    a, b = (json.loads((out / f"ws2-{flavor}.json").read_text()) for flavor in ("a", "b"))
    assert [r["pid"] for r in a] == [r["pid"] for r in b], "both cells ran on the same rank processes"
    for seen in (a, b):
        assert all(r["inductor"] == r["env"] for r in seen), seen
        assert seen[0]["env"] != seen[1]["env"], "two ranks of one cell shared one compile cache directory"
    assert not {r["env"] for r in a} & {r["env"] for r in b}, "two cells shared one compile cache directory"
