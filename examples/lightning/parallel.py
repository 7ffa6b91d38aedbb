"""The `parallelize` and `optimizer_adamw` components: the model and AdamW set up through Lightning
Fabric as a Fabric script sets them up (`fabric.setup_module`, `fabric.setup_optimizers`), with the
strategy the cell names: none (one device), fsdp1 (`FSDPStrategy`, sharded checkpoints) or fsdp2
(`ModelParallelStrategy` with `fully_shard`), each layer activation-checkpointed where asked. The
suites get the `_FabricModule` itself, as the loop holds it; the Fabric of each is kept for the
training step and the checkpointer (`fabric.backward`, `fabric.save`, `fabric.load`)."""

from __future__ import annotations

from collections.abc import Mapping
from weakref import WeakKeyDictionary

import torch
import torch.distributed as dist
from lightning.fabric import Fabric
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.fabric.wrappers import _FabricModule
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

LAYERS = {nn.TransformerEncoderLayer, nn.TransformerDecoderLayer}


FABRICS: WeakKeyDictionary[_FabricModule, Fabric] = WeakKeyDictionary()
"""Only for the protocol: each `_FabricModule` -> the Fabric that set it up."""


def parallelize(
    model: nn.Module, cell: Mapping[str, object], *, device: torch.device, activation_checkpointing: bool = False
) -> _FabricModule:
    """The model set up by `fabric.setup_module` under the cell's strategy, its layers checkpointed as
    Fabric's docs do it: FSDPStrategy's `activation_checkpointing_policy`, else torch's
    `apply_activation_checkpointing` before the setup (what ModelParallelStrategy's docs leave to the user)."""
    fsdp = str(cell["fsdp"])
    if activation_checkpointing and fsdp != "fsdp1":
        apply_activation_checkpointing(model, check_fn=lambda module: type(module) in LAYERS)
    fabric = Fabric(
        accelerator=device.type,
        devices=dist.get_world_size(),
        strategy=strategy(fsdp, device, activation_checkpointing),
        plugins=[ProcessGroupEnvironment()],
    )
    fabric.launch()
    wrapped = fabric.setup_module(model)
    FABRICS[wrapped] = fabric
    return wrapped


def build_adamw(params, *, lr: float, betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.1, model):
    """AdamW over the set-up model's parameters, set up by the model's Fabric."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    return FABRICS[model].setup_optimizers(optimizer)


def strategy(fsdp: str, device: torch.device, activation_checkpointing: bool):
    """Fabric's strategy for the cell's `fsdp`: FSDP1 wraps (and checkpoints, where asked) each encoder and decoder layer."""
    if fsdp == "none":
        return "auto"
    if fsdp == "fsdp1":
        fsdp_strategy = FSDPStrategy if device.type == "cuda" else CPUFSDPStrategy
        return fsdp_strategy(
            auto_wrap_policy=LAYERS, activation_checkpointing_policy=LAYERS if activation_checkpointing else None
        )
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
