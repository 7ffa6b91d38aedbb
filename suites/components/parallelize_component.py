"""How the suites call the `parallelize` component: with the cell's DeviceMesh where its signature
names `mesh` (torchmatrix.testing.cell_mesh: 1-D for mesh=flat, 2-D for hsdp and fsdp_tp), so a
stack's own parallelize shards over the mesh the cell names rather than one it guesses."""

from __future__ import annotations

from torchmatrix.testing import accepts, cell_mesh, load

from ..state.built_names import module_names, remember_built


def parallelized(components: dict, model, cell, *, device, mesh=None, **keywords):
    """`parallelize(model, cell, device=device, **keywords)`, plus `mesh` (given, else the cell's) where it
    names it; the names of `model` as built are remembered for the result (suites/state/built_names.py)."""
    parallelize = load(components["parallelize"])
    if accepts(parallelize, "mesh"):
        keywords["mesh"] = mesh if mesh is not None else cell_mesh(cell, device.type)
    built = module_names(model)
    return remember_built(parallelize(model, cell, device=device, **keywords), built)
