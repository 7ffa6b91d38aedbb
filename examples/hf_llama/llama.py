"""transformers' own LlamaForCausalLM as the `model` component, and the keyword arguments a training
step passes it as the `batch` component (torchmatrix/components/protocol.py).

A tiny config with random weights, so nothing is downloaded. The suites read the loss and the
KV cache from the model's own output (`CausalLMOutputWithPast`) and count checkpoint recompute
themselves, so the model is used as transformers ships it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM


def build_model(cell: Mapping[str, object], *, dtype: torch.dtype, dropout: float = 0.0) -> LlamaForCausalLM:
    """Two decoder layers, grouped-query attention (4 query heads, 2 KV heads), a vocabulary of 64
    (the resume suite's default dataset); `attn_implementation` from the cell's `attn` axis."""
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attention_dropout=dropout,
        tie_word_embeddings=False,
        attn_implementation=cell["attn"],
    )
    return LlamaForCausalLM(config).to(dtype)


def make_batch(model: LlamaForCausalLM, *, seed: int, device: torch.device) -> dict[str, object]:
    """Two sequences of 16 random token ids predicting themselves, with a fresh KV cache."""
    tokens = torch.randint(model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(seed))
    tokens = tokens.to(device)
    return {"input_ids": tokens, "labels": tokens, "use_cache": True, "cache": DynamicCache(config=model.config)}
