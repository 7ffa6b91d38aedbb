"""How the suites call the `parallelize` component: with the cell's DeviceMesh where its signature
names `mesh` (torchmatrix.testing.cell_mesh: 1-D for mesh=flat, 2-D for hsdp and fsdp_tp), so a
stack's own parallelize shards over the mesh the cell names rather than one it guesses."""

from __future__ import annotations

from torchmatrix.testing import accepts, cell_mesh, load


def parallelized(components: dict, model, cell, *, device, mesh=None, **keywords):
    """`parallelize(model, cell, device=device, **keywords)`, plus `mesh` (given, else the cell's) where it names it."""
    parallelize = load(components["parallelize"])
    if accepts(parallelize, "mesh"):
        keywords["mesh"] = mesh if mesh is not None else cell_mesh(cell, device.type)
    return parallelize(model, cell, device=device, **keywords)
