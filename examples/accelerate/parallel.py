"""The `parallelize`, `optimizer_adamw` and `scheduler` components: the model, AdamW and the LR
schedule prepared by Hugging Face accelerate as its docs prepare them (`accelerator.prepare`), under
`Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2, ...))` for an fsdp2 cell
(each decoder layer and then the root `fully_shard`ed, layers activation-checkpointed by the plugin
where asked) and a plain `Accelerator()` otherwise. The suites get what `prepare` returns."""

from __future__ import annotations

import os
from collections.abc import Mapping
from weakref import WeakKeyDictionary

import torch
from accelerate import Accelerator, DataLoaderConfiguration, FullyShardedDataParallelPlugin
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

ACCELERATORS: WeakKeyDictionary[object, Accelerator] = WeakKeyDictionary()
"""Only for the protocol: each prepared model and optimizer -> the Accelerator that prepared it."""
BUILDING: list[Accelerator] = []
"""Only for the protocol: the Accelerator of the training run being built, for its scheduler and loader."""


def parallelize(
    model: nn.Module, cell: Mapping[str, object], *, device: torch.device, activation_checkpointing: bool = False
) -> nn.Module:
    """The model prepared by an Accelerator with FSDP2 sharding (and checkpointing, where asked) each
    decoder layer and the root for an fsdp2 cell; else by a plain one, its layers checkpointed by torch's
    `apply_activation_checkpointing` where asked (the plugin checkpoints only under FSDP)."""
    fsdp_plugin = None
    if cell["fsdp"] == "fsdp2":
        fsdp_plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2,
            auto_wrap_policy="transformer_based_wrap",
            transformer_cls_names_to_wrap=sorted({type(layer).__name__ for layer in model.decoder_layers()}),
            activation_checkpointing=activation_checkpointing,
            state_dict_type="SHARDED_STATE_DICT",
        )
    elif cell["fsdp"] != "none":
        raise ValueError(f"cell axis fsdp={cell['fsdp']!r}: this example runs none or fsdp2")
    elif activation_checkpointing:
        apply_activation_checkpointing(model, check_fn=lambda module: module in model.decoder_layers())
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = Accelerator(
        cpu=device.type == "cpu",
        fsdp_plugin=fsdp_plugin,
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True),
    )
    if fsdp_plugin is not None and device.type == "cpu":
        PartialState().distributed_type = accelerator.state.distributed_type = DistributedType.FSDP
        accelerator.state.fsdp_plugin = fsdp_plugin
    BUILDING[:] = [accelerator]
    prepared = accelerator.prepare(model)
    ACCELERATORS[prepared] = accelerator
    return prepared


def build_adamw(params, *, lr: float, betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.1, model):
    """AdamW over the prepared model's parameters, prepared by its Accelerator (with the model again:
    FSDP2 refuses an optimizer prepared alone; the model, sharded already, is returned as it is)."""
    accelerator = ACCELERATORS[model]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    _, prepared = accelerator.prepare(model, optimizer)
    ACCELERATORS[prepared] = accelerator
    return prepared


def build_scheduler(optimizer, *, warmup_steps: int):
    """A linear warm-up, prepared: accelerate's scheduler steps with the optimizer it wraps."""
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer.optimizer, lambda step: min(1.0, (step + 1) / warmup_steps))
    return ACCELERATORS[optimizer].prepare(scheduler)
