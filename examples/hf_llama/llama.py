"""A tiny Hugging Face Llama as the `model` and `batch` components (torchmatrix/components/protocol.py).

`LlamaForTraining` is transformers' own LlamaForCausalLM, built from a LlamaConfig with
random weights (nothing is downloaded), with the three things the suites need on top: a
forward taking token ids that returns the loss and the KV cache the layers wrote,
`decoder_layers()` and `body_calls()`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple

import torch
from torch import Tensor
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

BATCH_SIZE = 2
SEQ_LEN = 16


def tiny_config(attn: str, dropout: float) -> LlamaConfig:
    """Two decoder layers, grouped-query attention (4 query heads, 2 KV heads), a vocabulary of 64
    (the resume suite's default dataset), no weight tying."""
    return LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attention_dropout=dropout,
        tie_word_embeddings=False,
        attn_implementation=attn,
    )


class CacheView(Mapping):
    """A live `past_key_values` view of a DynamicCache: layer index -> (keys, values).

    Live, so that reading it after backward shows what checkpoint recompute left in the cache.
    """

    def __init__(self, cache: DynamicCache):
        self.cache = cache

    def __getitem__(self, layer_idx: int) -> tuple[Tensor, Tensor]:
        if not 0 <= layer_idx < len(self.cache.layers) or not self.cache.layers[layer_idx].is_initialized:
            raise KeyError(layer_idx)
        entry = self.cache.layers[layer_idx]
        return entry.keys, entry.values

    def __iter__(self) -> Iterator[int]:
        return (i for i, entry in enumerate(self.cache.layers) if entry.is_initialized)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class TrainingOutput(NamedTuple):
    loss: Tensor
    past_key_values: CacheView


class LlamaForTraining(LlamaForCausalLM):
    """LlamaForCausalLM whose forward takes token ids, predicts each next token, and always passes
    a fresh DynamicCache with `use_cache=True`, so the cache is part of every step.

    transformers keeps or drops that cache itself: under its gradient checkpointing, a decoder
    layer that writes the cache gets `past_key_values=None` (GradientCheckpointingLayer), because
    recompute would append to the cache a second time.
    """

    def __init__(self, config: LlamaConfig):
        super().__init__(config)
        self.layer_body_calls = dict.fromkeys(range(config.num_hidden_layers), 0)
        for index, layer in enumerate(self.model.layers):
            layer.input_layernorm.register_forward_pre_hook(self._counter(index))

    def _counter(self, index: int):
        """A hook on the layer's first submodule: it runs whenever the layer body runs, recompute
        included (transformers checkpoints the layer's `forward`, so hooks on the layer itself
        would not see recompute)."""

        def count(module, args):
            self.layer_body_calls[index] += 1

        return count

    def forward(self, tokens: Tensor) -> TrainingOutput:
        cache = DynamicCache(config=self.config)
        output = super().forward(input_ids=tokens, labels=tokens, past_key_values=cache, use_cache=True)
        return TrainingOutput(output.loss, CacheView(cache))

    def decoder_layers(self) -> list[torch.nn.Module]:
        return list(self.model.layers)

    def body_calls(self) -> dict[str, int]:
        return {f"model.layers.{index}": calls for index, calls in self.layer_body_calls.items()}


def build_model(cell: Mapping[str, object], *, dtype: torch.dtype, dropout: float = 0.0) -> LlamaForTraining:
    """Component `model`: `attn_implementation` from the cell's `attn` axis ("sdpa" | "eager")."""
    return LlamaForTraining(tiny_config(str(cell["attn"]), dropout)).to(dtype)


def make_batch(model: LlamaForTraining, *, seed: int, device: torch.device) -> dict[str, Tensor]:
    """Component `batch`: random token ids from a generator seeded with `seed`."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(model.config.vocab_size, (BATCH_SIZE, SEQ_LEN), generator=generator)
    return {"tokens": tokens.to(device)}
