"""Compile cache keys without a DeviceMesh's per-process hash, so a tensor-parallel graph is found warm.

Inductor's FX graph key and AOTAutograd's key pickle every DeviceMesh a graph takes as input with its
state, which holds `_hash`, the mesh's `hash()` cached on first use: a value of this process's own
(it hashes strings, randomized per process, and on Python 3.11 None, hashed by its address), so every
key differs in each new process and no DTensor graph was ever read back from the compile store
(docs/explanation/compile.md, "DTensor graphs and the cache key"). The key here pickles the rest of
the state, every field the mesh's equality compares.
"""

from __future__ import annotations

import functools

PER_PROCESS_FIELDS = ("_hash",)  # the cached hash() of the mesh; _pg_registry the mesh leaves out itself


def mesh_key_state(mesh) -> tuple:
    """The mesh's pickled state for a cache key: its fields by name, less those of this process alone."""
    state = mesh.__getstate__()  # DeviceMesh's own: its fields less its process group registry
    return tuple(sorted((name, value) for name, value in state.items() if name not in PER_PROCESS_FIELDS))


def keyed_mesh(class_name: str, state: tuple) -> tuple:
    """What a cache key records for a mesh; named by reference in the key, never called on a hit."""
    return class_name, state


def _reduce_mesh(mesh) -> tuple:
    return keyed_mesh, (type(mesh).__qualname__, mesh_key_state(mesh))


def stable_mesh_keys() -> bool:
    """From now on this process's compile cache keys record a DeviceMesh without its cached hash; False
    where this torch has no FX graph cache pickler or no DeviceMesh (its keys are left as they are)."""
    try:
        from torch._inductor.codecache import FxGraphCachePickler
        from torch.distributed.device_mesh import DeviceMesh
    except ImportError:
        return False
    original = FxGraphCachePickler.__init__
    if getattr(original, "keys_meshes_stably", False):
        return True

    @functools.wraps(original)
    def with_stable_meshes(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if isinstance(getattr(self, "dispatch_table", None), dict):
            self.dispatch_table.setdefault(DeviceMesh, _reduce_mesh)

    with_stable_meshes.keys_meshes_stably = True
    FxGraphCachePickler.__init__ = with_stable_meshes
    return True
