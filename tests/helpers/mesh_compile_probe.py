"""One fresh process that compiles a tensor-parallel model under Inductor, as a rank of a cell would,
and prints how its graphs fared in the compile cache: python mesh_compile_probe.py DIM_NAME [--stable-keys].

The cache is TORCHINDUCTOR_CACHE_DIR; the model is two linear layers parallelized over a one-rank mesh
whose dimension is named DIM_NAME, so two probes differ in their mesh and nothing else."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from torchmatrix.ranks.mesh_cache_keys import stable_mesh_keys


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def main(dim_name: str, stable_keys: bool) -> None:
    if stable_keys:
        stable_mesh_keys()
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=(dim_name,))
    torch.manual_seed(0)
    model = parallelize_module(TwoLayers(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    torch.compile(model, backend="inductor")(torch.randn(4, 16)).sum().backward()
    dist.destroy_process_group()
    counters = torch._dynamo.utils.counters
    print(json.dumps({**counters["inductor"], **counters["aot_autograd"]}))


if __name__ == "__main__":
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR"), "set TORCHINDUCTOR_CACHE_DIR"
    main(sys.argv[1], "--stable-keys" in sys.argv[2:])
