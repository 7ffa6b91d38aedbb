"""aot_eager's graphs in the compile store. Torch's AOTAutograd cache keeps only what Inductor compiles
unless two switches of its own precompile path are on, which make aot_eager's forward and backward graphs
entries of that cache too (`AOTEagerOutputCode`, torch 2.13.0 to 2.15.0). A rank turns them on while its
cell compiles with aot_eager alone, so the entries land in the cell's own folder under the store's key,
and off for every other cell: an Inductor graph stays exactly as torch caches it, and a backend of the
user's, whose output may not pickle, never meets them."""

from __future__ import annotations

SWITCHES = ("force_autograd_cache", "bundled_autograd_cache")
"""`torch._functorch.config`'s switches that route a non-Inductor backend's graphs through the cache."""


def keep_aot_eager_graphs(keep: bool) -> bool:
    """Set both switches to `keep`; whether this torch can keep aot_eager's graphs (one without keeps
    nothing, as before). Only turning them on imports aot_eager's backend, which an eager cell's ranks never need."""
    import torch._functorch.config as functorch_config

    if not all(hasattr(functorch_config, switch) for switch in SWITCHES):
        return False
    if keep:
        from torch._dynamo.backends import debugging

        if not hasattr(debugging, "AOTEagerOutputCode"):
            return False
    for switch in SWITCHES:
        setattr(functorch_config, switch, keep)
    return True
