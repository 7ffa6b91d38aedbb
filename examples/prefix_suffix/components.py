"""The policy's factories as its trainer calls them, named in matrix.toml's [components]."""

from __future__ import annotations

import torch
from policy import PolicyConfig, PrefixSuffixPolicy, sample_batch
from torch.distributed.fsdp import fully_shard


def build_policy(cell, *, dtype: torch.dtype, dropout: float = 0.0) -> PrefixSuffixPolicy:
    return PrefixSuffixPolicy(PolicyConfig(dropout=dropout)).to(dtype)


def make_batch(model: PrefixSuffixPolicy, *, seed: int, device: torch.device) -> dict[str, torch.Tensor]:
    batch = sample_batch(model.config, batch_size=2, generator=torch.Generator().manual_seed(seed))
    return {name: tensor.to(device) for name, tensor in batch.items()}


def parallelize(model: PrefixSuffixPolicy, cell, *, device: torch.device, activation_checkpointing: bool = False):
    model.gradient_checkpointing = activation_checkpointing
    model.to(device)
    if cell["fsdp"] == "fsdp2":
        fully_shard(model)
    return model
