"""Rank functions for tests/ranks/test_mesh_group_names.py: build cell meshes after other process
groups, as a rank pool does after earlier cells, and say what each mesh named its groups."""

from __future__ import annotations


def groups_named_after(groups_before: int, kinds: list[str], through_cell_mesh: bool) -> dict:
    """Create `groups_before` groups over every rank, then the mesh of each kind in `kinds` (through
    `cell_mesh`, or torch's `init_device_mesh` alone), and on each mesh sum the ranks over every dim:
    the dim group names of each mesh, and whether each sum was that dim's group's."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from torchmatrix.matrix.meshes import mesh_layout
    from torchmatrix.ranks import cell_mesh

    cell_mesh._BUILT.clear()  # build each mesh anew, also where this process built it before
    for _ in range(groups_before):
        dist.new_group(list(range(dist.get_world_size())))
    names, sums_right = {}, {}
    for kind in kinds:
        if through_cell_mesh:
            mesh = cell_mesh.cell_mesh({"mesh": kind, "world_size": dist.get_world_size()}, "cpu")
        else:
            layout = mesh_layout(kind, dist.get_world_size(), 1)
            mesh = init_device_mesh("cpu", layout.shape, mesh_dim_names=layout.dim_names)
        names[kind] = list(mesh._dim_group_names)
        for dim in mesh.mesh_dim_names:
            group = mesh[dim].get_group()
            total = torch.tensor([dist.get_rank()])
            dist.all_reduce(total, group=group)
            sums_right[f"{kind}.{dim}"] = total.item() == sum(dist.get_process_group_ranks(group))
    return {"names": names, "sums_right": sums_right}


def sub_world_names_after(groups_before: int) -> list[str]:
    """Create `groups_before` groups over every rank, then dtensor_optim's sub-world meshes: the names
    of the sub-world groups this rank is in, after an all-reduce over each summed its own ranks."""
    import torch
    import torch.distributed as dist

    from suites.sharding import dtensor_optim_recipe

    dtensor_optim_recipe.SUB_WORLD_MESHES.clear()
    for _ in range(groups_before):
        dist.new_group(list(range(dist.get_world_size())))
    names = []
    for size, mesh in sorted(dtensor_optim_recipe.sub_world_meshes().items()):
        if mesh is None:
            continue
        total = torch.tensor([dist.get_rank()])
        dist.all_reduce(total, group=mesh.get_group())
        assert total.item() == sum(range(size)), (size, total.item())
        names.append(mesh.get_group().group_name)
    return names
