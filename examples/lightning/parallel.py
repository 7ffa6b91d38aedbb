"""The `parallelize` and `optimizer_adamw` components: the model and AdamW set up through Lightning
Fabric as a Fabric script sets them up (`fabric.setup_module`, `fabric.setup_optimizers`), with the
strategy the cell names: none (one device), fsdp1 (`FSDPStrategy`, sharded checkpoints) or fsdp2
(`ModelParallelStrategy` with `fully_shard`). The Fabric of each model is kept for the training step
and the checkpointer, which call the model through Fabric's wrapper and `fabric.backward`,
`fabric.save` and `fabric.load`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple
from weakref import WeakKeyDictionary

import torch
import torch.distributed as dist
from lightning.fabric import Fabric
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.fabric.wrappers import _FabricModule
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

LAYERS = {nn.TransformerEncoderLayer, nn.TransformerDecoderLayer}


class SetUp(NamedTuple):
    """What a Fabric loop holds for one model: the Fabric and the `_FabricModule` it returned."""

    fabric: Fabric
    module: _FabricModule


FABRICS: WeakKeyDictionary[nn.Module, SetUp] = WeakKeyDictionary()
"""The module under each `_FabricModule` (FSDP's root, or the model itself) -> its set-up."""


def parallelize(
    model: nn.Module, cell: Mapping[str, object], *, device: torch.device, activation_checkpointing: bool = False
) -> nn.Module:
    """The model set up by `fabric.setup_module` under the cell's strategy. Only for the protocol:
    the suites get the module under Fabric's wrapper, whose state (parameters, state dicts) they
    read; forward and backward still go through the wrapper, in the training step (step.py)."""
    if activation_checkpointing:
        raise ValueError("the Lightning example runs no grad_ckpt: activation checkpointing is not set up here")
    fabric = Fabric(
        accelerator=device.type,
        devices=dist.get_world_size(),
        strategy=strategy(str(cell["fsdp"]), device),
        plugins=[ProcessGroupEnvironment()],
    )
    fabric.launch()
    wrapped = fabric.setup_module(model)
    FABRICS[wrapped._forward_module] = SetUp(fabric, wrapped)
    return wrapped._forward_module


def build_adamw(params, *, lr: float, betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.1, model):
    """AdamW over the set-up model's parameters, set up by the model's Fabric."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    return FABRICS[model].fabric.setup_optimizers(optimizer)


def strategy(fsdp: str, device: torch.device):
    """Fabric's strategy for the cell's `fsdp`: FSDP1 wraps each encoder and decoder layer."""
    if fsdp == "none":
        return "auto"
    if fsdp == "fsdp1":
        fsdp_strategy = FSDPStrategy if device.type == "cuda" else CPUFSDPStrategy
        return fsdp_strategy(auto_wrap_policy=LAYERS)
    if fsdp == "fsdp2":
        return ModelParallelStrategy(
            parallelize_fn=shard_layers, data_parallel_size=dist.get_world_size(), tensor_parallel_size=1
        )
    raise ValueError(f"cell axis fsdp={fsdp!r}: expected none, fsdp1 or fsdp2")


def shard_layers(model: nn.Module, device_mesh) -> nn.Module:
    """ModelParallelStrategy's parallelize function: `fully_shard` each layer, then the root."""
    mesh = device_mesh["data_parallel"]
    for module in model.modules():
        if type(module) in LAYERS:
            fully_shard(module, mesh=mesh)
    return fully_shard(model, mesh=mesh)


class ProcessGroupEnvironment(LightningEnvironment):
    """Only for the protocol: Fabric's cluster environment for rank processes that are already started
    and joined into one process group (by torchmatrix's rank pool), which Fabric then reuses."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    def local_rank(self) -> int:
        return dist.get_rank()


class CPUFSDPStrategy(FSDPStrategy):
    """CPU-simulation limit: FSDPStrategy itself on CPU ranks talking gloo. Fabric refuses the
    FSDPStrategy class by its exact type off a GPU, and passes FSDP no `device_id` for a CPU."""

    def setup_module(self, module: nn.Module) -> nn.Module:
        wrapped = FullyShardedDataParallel(module, device_id=self.root_device, **self._fsdp_kwargs)
        return super().setup_module(wrapped)
