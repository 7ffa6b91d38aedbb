"""torchtitan 0.3.0's Llama 3 debug model as the `model` and `batch` components
(torchmatrix/components/protocol.py).

`Llama3ForTraining` is torchtitan's own `Llama3Model`, built from its `debugmodel` config and
initialised by its own `init_states()`, its forward running its trainer's step up to the loss.
The suites count checkpoint recompute themselves and find that the model keeps no KV cache.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor
from torchtitan.components.loss import cross_entropy_loss
from torchtitan.models.common import Linear
from torchtitan.models.common.attention import (
    FlexAttention,
    FusedQKVLinear,
    QKVLinear,
    ScaledDotProductAttention,
)
from torchtitan.models.llama3 import _LINEAR_INIT as LINEAR_INIT
from torchtitan.models.llama3 import Llama3Model, llama3_configs

BATCH_SIZE = 2
SEQ_LEN = 16


def debug_config(attn: str, qkv: str) -> Llama3Model.Config:
    """torchtitan's `debugmodel` (6 layers, dim 256, 16 heads, vocab 2048) with the cell's attention
    and QKV projection. attn "flex" is torchtitan's default; "sdpa" swaps in its
    ScaledDotProductAttention (causal, no document mask), which 0.3.0 no longer offers for
    language models by name. qkv "fused" is the debug model as shipped (FusedQKVLinear); "split"
    is torchtitan's QKVLinear (separate wq, wk, wv), as `fuse_qkv=False` builds it."""
    if attn not in ("sdpa", "flex"):
        raise ValueError(f"cell axis attn={attn!r}: expected sdpa or flex")
    if qkv not in ("fused", "split"):
        raise ValueError(f"cell axis qkv={qkv!r}: expected fused or split")
    config = llama3_configs["debugmodel"](attn_backend="flex")
    for layer in config.layers:
        if attn == "sdpa":
            layer.attention = dataclasses.replace(layer.attention, inner_attention=ScaledDotProductAttention.Config())
        if qkv == "split":
            layer.attention = dataclasses.replace(layer.attention, qkv_linear=split_qkv(layer.attention.qkv_linear))
    return config


def split_qkv(fused: FusedQKVLinear.Config) -> QKVLinear.Config:
    """The separate projections of a fused one, initialised like torchtitan's unfused layers."""
    dim, head_dim = fused.wqkv.in_features, fused.head_dim
    return QKVLinear.Config(
        head_dim=head_dim,
        wq=Linear.Config(in_features=dim, out_features=fused.n_heads * head_dim, param_init=LINEAR_INIT),
        wkv=Linear.Config(in_features=dim, out_features=fused.n_kv_heads * head_dim, param_init=LINEAR_INIT),
    )


class Llama3ForTraining(Llama3Model):
    """Llama3Model whose forward is its trainer's step up to the loss: the suites call the model for
    the loss, where torchtitan's trainer calls its loss function after the model."""

    def forward(self, tokens: Tensor) -> Tensor:
        """As torchtitan's trainer runs a batch: inputs and next-token labels, one document per row
        (positions 0..L-1) with FlexAttention's document mask (SDPA is causal without one), and the
        summed loss divided by the step's token count over every data-parallel rank (its FSDP sums
        gradients: divide factor 1)."""
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        positions = torch.arange(inputs.shape[1], device=inputs.device).expand_as(inputs)
        flex = isinstance(self.config.first_attention.inner_attention, FlexAttention.Config)
        masks = self.get_attention_masks(positions) if flex else None
        param = next(self.parameters())
        ranks = param.device_mesh.size() if isinstance(param, DTensor) else 1
        return cross_entropy_loss(super().forward(inputs, positions, masks), labels) / (labels.numel() * ranks)


def build_model(cell: Mapping[str, object], *, dtype: torch.dtype, dropout: float = 0.0) -> Llama3ForTraining:
    """Component `model`: torchtitan's debug model; `dropout` is ignored (the model has none)."""
    model = Llama3ForTraining(debug_config(str(cell["attn"]), str(cell["qkv"])))
    model.init_states()
    return model.to(dtype)


def make_batch(model: Llama3ForTraining, *, seed: int, device: torch.device) -> dict[str, Tensor]:
    """Component `batch`: random token ids from a generator seeded with `seed`."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(model.config.vocab_size, (BATCH_SIZE, SEQ_LEN + 1), generator=generator)
    return {"tokens": tokens.to(device)}
