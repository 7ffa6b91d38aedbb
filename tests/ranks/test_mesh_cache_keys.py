"""A tensor-parallel graph compiled in one process is read back from the compile cache in the next,
and only by a graph over the same mesh: the key leaves out the mesh's per-process hash and keeps the
rest of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchmatrix.ranks.mesh_cache_keys import mesh_key_state

PROBE = Path(__file__).resolve().parent.parent / "helpers" / "mesh_compile_probe.py"
ROOT = PROBE.parent.parent.parent


def _probe(cache: Path, dim_name: str, *flags: str) -> dict:
    """What one fresh process's compile of the probe model read from `cache` and wrote to it."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(PROBE), dim_name, *flags], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def compiled_once(tmp_path_factory) -> tuple[Path, dict]:
    """A cache that one process compiled the probe model over a mesh dimension named "tp" into."""
    cache = tmp_path_factory.mktemp("compile-cache")
    return cache, _probe(cache, "tp", "--stable-keys")


@pytest.mark.slow
def test_a_second_process_reads_the_tensor_parallel_graphs_the_first_compiled(compiled_once):
    cache, first = compiled_once
    second = _probe(cache, "tp", "--stable-keys")
    assert first.get("fxgraph_cache_miss", 0) == 2 and not first.get("fxgraph_cache_hit")
    assert second.get("fxgraph_cache_hit", 0) == 2 and not second.get("fxgraph_cache_miss")
    assert second.get("autograd_cache_hit", 0) == 1


@pytest.mark.slow
def test_a_graph_over_another_mesh_is_compiled_afresh(compiled_once):
    other = _probe(compiled_once[0], "mp", "--stable-keys")
    assert other.get("fxgraph_cache_miss", 0) == 2 and not other.get("fxgraph_cache_hit")
    assert other.get("autograd_cache_miss", 0) == 1 and not other.get("autograd_cache_hit")


class _Mesh:
    """The state a DeviceMesh pickles: its fields, its process group registry left out."""

    def __init__(self, names: tuple[str, ...], hashed: int):
        self._mesh_dim_names, self._layout, self._hash, self._pg_registry = names, (2, 1), hashed, {}

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_pg_registry")
        return state


def test_the_key_state_leaves_out_the_cached_hash_and_keeps_every_other_field():
    assert mesh_key_state(_Mesh(("tp",), 1)) == mesh_key_state(_Mesh(("tp",), -7))
    assert mesh_key_state(_Mesh(("tp",), 1)) != mesh_key_state(_Mesh(("dp",), 1))
    assert dict(mesh_key_state(_Mesh(("tp",), 1))) == {"_mesh_dim_names": ("tp",), "_layout": (2, 1)}
