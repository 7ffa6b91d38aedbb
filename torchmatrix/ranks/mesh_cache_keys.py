"""Compile cache keys without a DeviceMesh's per-process hash, so a tensor-parallel graph is found warm.

Inductor's FX graph key and AOTAutograd's key pickle every DeviceMesh a graph takes as input with its
state, which holds `_hash`, the mesh's `hash()` cached on first use: a value of this process's own
(it hashes strings, randomized per process, and on Python 3.11 None, hashed by its address), so every
key differs in each new process and no DTensor graph was ever read back from the compile store
(docs/explanation/compile.md, "DTensor graphs and the cache key"). The key here pickles the rest of
the state, every field the mesh's equality compares.

That state also names the mesh's process groups, which the graph's collectives call by name, and torch
names a group by how many groups its process made before, so in a rank pool the same mesh would be
named by the cells that ran before it; `group_names_of` names a mesh's groups from a range of its own.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Iterator

PER_PROCESS_FIELDS = ("_hash",)  # the cached hash() of the mesh; _pg_registry the mesh leaves out itself
GROUP_NAME_BASE = 1_000_000  # above any name a process reaches by counting its groups one by one
GROUP_NAME_SPAN = 1_000  # the names one mesh's groups may take from its first
GROUP_NAME_RANGES = 100_000  # how many ranges a mesh key's hash picks among


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


def group_name_base(mesh_key: tuple) -> int:
    """The first default name of the groups a mesh of `mesh_key` creates: the same in every process."""
    digest = hashlib.sha256(repr(mesh_key).encode()).digest()
    return GROUP_NAME_BASE + int.from_bytes(digest[:4], "big") % GROUP_NAME_RANGES * GROUP_NAME_SPAN


@contextlib.contextmanager
def group_names_of(mesh_key: tuple) -> Iterator[None]:
    """Groups created inside take their default names from `mesh_key`'s own range instead of this process's
    count so far, then the count goes on where it was. Unchanged where this torch does not name groups by
    that count (hashed names, as `split_group` gives a CUDA mesh), or where a group already holds a name of
    the range: the mesh is then named as before, which can only miss the compile cache, never hit wrongly."""
    from torch.distributed import distributed_c10d

    world = getattr(distributed_c10d, "_world", None)
    if not isinstance(getattr(type(world), "group_count", None), property) or not hasattr(world, "pg_names"):
        yield
        return
    base = group_name_base(mesh_key)
    if any(_in_range(name, base) for name in world.pg_names.values()):
        yield
        return
    counted = world.group_count
    world.group_count = base
    try:
        yield
    finally:
        created = world.group_count - base
        world.group_count = counted
    if created > GROUP_NAME_SPAN:
        raise RuntimeError(f"a mesh created {created} process groups; the names of {GROUP_NAME_SPAN} were set aside")


def _in_range(name: str, base: int) -> bool:
    return str(name).isdigit() and base <= int(name) < base + GROUP_NAME_SPAN
