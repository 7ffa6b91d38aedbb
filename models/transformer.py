"""The reference model of the grad-ckpt suite: a tiny decoder that uses a KV cache the way
pi05's PaliGemma-with-expert does (public report "pi05 grad-ckpt + KV cache: pin
gradient-equivalence with a focused regression test").

A prefix stack writes ``past_key_values[i]`` during forward; an "expert" stack then runs on
the suffix tokens and its layer ``i`` attends over the prefix keys/values that prefix layer
``i`` cached. Each layer can run its body under ``torch.utils.checkpoint``, so during
backward the bodies execute again and rewrite their cache entries: gradients only match the
uncheckpointed model if that rewrite is idempotent and recompute sees what forward saw.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right
from torch.utils.checkpoint import checkpoint

from torchmatrix.components.compile_axis import DEFAULT_BACKEND
from torchmatrix.components.pipeline_axis import pipelines
from torchmatrix.matrix.meshes import FLAT, mesh_kind
from torchmatrix.testing import DEFAULT_IMPLEMENTATION, implementation_of

from .block_compile import compile_mode

SDPA_BACKENDS = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
ATTENTION_KINDS = ("sdpa", "eager")
LAYERS_PER_STACK = 3
SHALLOW_LAYERS_PER_STACK = 2
"""Layers per stack in a cell that compiles its blocks, steps an optimizer implementation other than the
default, shards over a 2-D mesh or pipelines. Compile time grows with every block (a block's graphs specialise on
its cache entry and index, so identical blocks cannot share one) and every parameter (the compiled step
unrolls per parameter); an implementation's step and state dict, and a 2-D mesh's split and shards, treat
every layer alike, so a third layer only repeats them; the interleaved schedule's four pipeline stages
need four layers, one each. Two, not one: a bug that needs a layer index above
0, or a cache entry read across layers, shows only where a stack has a second layer."""
INDUCTOR_LAYERS_PER_STACK = 1
"""Layers per stack where Inductor compiles the blocks: it generates and builds C++ per graph, so a second
layer nearly doubles the cell's cost (docs/explanation/performance.md). The bugs that need depth are left
to the cells of each of its axes at two layers: aot_eager blocks, each optimizer implementation, each mesh."""
DEPTH_AXIS = "layers_per_stack"
"""The cell key that, where a cell has it, sets the reference decoder's layers per stack."""


@dataclass(frozen=True)
class DecoderConfig:
    """Sizes of the reference decoder; the defaults keep one forward+backward in milliseconds on CPU."""

    attn: str = "sdpa"
    sdpa_backend: str | None = None
    dropout: float = 0.0
    vocab_size: int = 64
    width: int = 32
    heads: int = 4
    mlp_width: int = 64
    layers_per_stack: int = LAYERS_PER_STACK
    prefix_len: int = 8
    suffix_len: int = 8
    batch_size: int = 2

    def __post_init__(self) -> None:
        if self.attn not in ATTENTION_KINDS:
            raise ValueError(f"attn={self.attn!r}: expected one of {', '.join(ATTENTION_KINDS)}")
        if self.sdpa_backend is not None and self.sdpa_backend not in SDPA_BACKENDS:
            raise ValueError(f"sdpa_backend={self.sdpa_backend!r}: expected one of {', '.join(SDPA_BACKENDS)}")
        if type(self.layers_per_stack) is not int or self.layers_per_stack < 1:
            raise ValueError(f"layers_per_stack={self.layers_per_stack!r}: expected a whole number, 1 or more")


class KVCache(MutableMapping):
    """``past_key_values``: layer index -> (keys, values), each (batch, heads, tokens, head_dim).

    A mapping of its own rather than a dict, so FSDP's forward-input handling (which rebuilds
    dicts) hands the layers this very object and their writes land where the caller looks.
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple[Tensor, Tensor]] = {}

    def __getitem__(self, layer_idx: int) -> tuple[Tensor, Tensor]:
        return self._entries[layer_idx]

    def __setitem__(self, layer_idx: int, keys_values: tuple[Tensor, Tensor]) -> None:
        self._entries[layer_idx] = keys_values

    def __delitem__(self, layer_idx: int) -> None:
        del self._entries[layer_idx]

    def __iter__(self) -> Iterator[int]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


class DecoderOutput(NamedTuple):
    """What a forward returns: the training loss and the cache the layers filled."""

    loss: Tensor
    past_key_values: KVCache


def lower_right_causal_mask(query_len: int, key_len: int, device: torch.device) -> Tensor:
    """Boolean mask (True = attend) placing the queries at the END of the keys, as with a KV cache.

    Query ``t`` may see keys ``0 .. key_len - query_len + t``; a cache entry that grew (an
    append instead of an overwrite) therefore changes what every query sees.
    """
    return torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril(key_len - query_len)


def attend(query: Tensor, keys: Tensor, values: Tensor, config: DecoderConfig) -> Tensor:
    """Lower-right causal attention, through ``F.scaled_dot_product_attention`` or spelled out (eager).

    SDPA gets the mask as a ``causal_lower_right`` bias rather than a tensor, so fused kernels
    (flash, memory-efficient) can take it on GPU.
    """
    query_len, key_len = query.shape[-2], keys.shape[-2]
    if config.attn == "eager":
        scores = (query @ keys.transpose(-2, -1)) * query.shape[-1] ** -0.5
        mask = lower_right_causal_mask(query_len, key_len, query.device)
        return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ values
    if torch.compiler.is_compiling():
        # Dynamo cannot build the CausalBias tensor subclass in a graph (a graph break): the same mask as a tensor
        mask = lower_right_causal_mask(query_len, key_len, query.device)
        return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask)
    bias = causal_lower_right(query_len, key_len)
    if config.sdpa_backend is None:
        return F.scaled_dot_product_attention(query, keys, values, attn_mask=bias)
    with sdpa_kernel(SDPA_BACKENDS[config.sdpa_backend]):
        return F.scaled_dot_product_attention(query, keys, values, attn_mask=bias)


class DecoderLayer(nn.Module):
    """Pre-norm attention + MLP block whose body optionally runs under activation checkpointing.

    ``checkpointing`` is the per-layer switch (parallelize sets it before sharding);
    ``body_calls`` counts body executions in Python, so a test can see that recompute really ran
    (a body traced into a compiled block's graph runs as the graph and is not counted).
    Subclasses decide which cached keys/values the attention uses (``keys_values``).
    """

    def __init__(self, config: DecoderConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.checkpointing = False
        self.body_calls = 0
        self.attn_norm = nn.RMSNorm(config.width)
        self.q_proj = nn.Linear(config.width, config.width, bias=False)
        self.k_proj = nn.Linear(config.width, config.width, bias=False)
        self.v_proj = nn.Linear(config.width, config.width, bias=False)
        self.o_proj = nn.Linear(config.width, config.width, bias=False)
        self.mlp_norm = nn.RMSNorm(config.width)
        self.mlp_in = nn.Linear(config.width, config.mlp_width, bias=False)
        self.mlp_out = nn.Linear(config.mlp_width, config.width, bias=False)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, hidden: Tensor, cache: KVCache) -> Tensor:
        if self.checkpointing and torch.compiler.is_compiling():
            return self.traced_checkpoint(hidden, cache)
        if self.checkpointing:
            return self.checkpointed(self.body, hidden, cache)
        return self.body(hidden, cache)

    def checkpointed(self, function, *args):
        """``function(*args)`` under non-reentrant activation checkpointing: every op recomputed in backward."""
        return checkpoint(function, *args, use_reentrant=False)

    def traced_checkpoint(self, hidden: Tensor, cache: KVCache) -> Tensor:
        """The checkpointed body as torch.compile traces it into the block's graph (compile outside):
        a checkpointed region with Python side effects breaks the graph, so the region computes on a
        copy of the cache and returns what it wrote, which is written back outside it. Recompute then
        runs inside the compiled backward, where no Python runs again."""

        def region(hidden: Tensor, entries: dict[int, tuple[Tensor, Tensor]]):
            local = KVCache()
            local.update(entries)
            return self.compute(hidden, local), dict(local.items())

        hidden, written = self.checkpointed(region, hidden, dict(cache.items()))
        cache.update(written)
        return hidden

    def body(self, hidden: Tensor, cache: KVCache) -> Tensor:
        if not torch.compiler.is_compiling():  # a counter in a graph would recompile it at every call
            self.body_calls += 1
        return self.compute(hidden, cache)

    def compute(self, hidden: Tensor, cache: KVCache) -> Tensor:
        """The layer's computation, uncounted (models/function_units.py runs it as a function unit)."""
        normed = self.attn_norm(hidden)
        query, key, value = (self.split_heads(proj(normed)) for proj in (self.q_proj, self.k_proj, self.v_proj))
        keys, values = self.keys_values(cache, key, value)
        attended = attend(query, keys, values, self.config).transpose(1, 2).flatten(2)
        hidden = hidden + self.dropout(self.o_proj(attended))
        mlp = self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(hidden))))
        return hidden + self.dropout(mlp)

    def split_heads(self, projected: Tensor) -> Tensor:
        """(batch, tokens, heads x head_dim) -> (batch, heads, tokens, head_dim), counting the heads from the
        width: under tensor parallelism a rank's q/k/v projections output only its own heads, as in torchtitan."""
        batch, tokens, _ = projected.shape
        return projected.view(batch, tokens, -1, self.config.width // self.config.heads).transpose(1, 2)

    def keys_values(self, cache: KVCache, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


class PrefixLayer(DecoderLayer):
    """Self-attention over the prefix that stores its keys/values as ``cache[layer_idx]`` (overwrite)."""

    def keys_values(self, cache: KVCache, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        cache[self.layer_idx] = (key, value)
        return cache[self.layer_idx]


class ExpertLayer(DecoderLayer):
    """Suffix ("expert") layer attending over prefix layer ``layer_idx``'s cached keys/values plus its own."""

    def keys_values(self, cache: KVCache, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        prefix_keys, prefix_values = cache[self.layer_idx]
        return torch.cat((prefix_keys, key), dim=2), torch.cat((prefix_values, value), dim=2)


def next_token_loss(logits: Tensor, tokens: Tensor) -> Tensor:
    """The decoder's loss: mean cross-entropy of each position's logits against the next token, in float32."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


class PrefixExpertDecoder(nn.Module):
    """Embedding, a prefix stack, an expert stack reading the prefix's cache, and a next-token head.

    The loss covers prefix and suffix positions, so every parameter receives a gradient.
    ``tokens_seen`` is a buffer that forward advances outside the checkpointed layers, the
    recompute-safe way to keep a counter; ``cache_type`` is what ``past_key_values`` is built as.
    """

    def __init__(
        self,
        config: DecoderConfig,
        prefix_layer: type[DecoderLayer] = PrefixLayer,
        expert_layer: type[DecoderLayer] = ExpertLayer,
        cache_type: type[KVCache] = KVCache,
    ) -> None:
        super().__init__()
        self.config = config
        self.cache_type = cache_type
        self.register_buffer("tokens_seen", torch.zeros((), dtype=torch.int64), persistent=False)
        self.embed = nn.Embedding(config.vocab_size, config.width)
        self.prefix_layers = nn.ModuleList(prefix_layer(config, i) for i in range(config.layers_per_stack))
        self.expert_layers = nn.ModuleList(expert_layer(config, i) for i in range(config.layers_per_stack))
        self.final_norm = nn.RMSNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab_size, bias=False)

    def forward(self, tokens: Tensor, past_key_values: KVCache | None = None) -> DecoderOutput:
        cache = self.cache_type() if past_key_values is None else past_key_values
        with torch.no_grad():
            self.tokens_seen += tokens.numel()
        embedded = self.embed(tokens)
        prefix = embedded[:, : self.config.prefix_len]
        suffix = embedded[:, self.config.prefix_len :]
        for layer in self.prefix_layers:
            prefix = layer(prefix, cache)
        for layer in self.expert_layers:
            suffix = layer(suffix, cache)
        logits = self.head(self.final_norm(torch.cat((prefix, suffix), dim=1)))
        return DecoderOutput(next_token_loss(logits, tokens), cache)

    def decoder_layers(self) -> list[nn.Module]:
        """The checkpointing and sharding units, in forward order."""
        return [*self.prefix_layers, *self.expert_layers]

    def body_calls(self) -> dict[str, int]:
        """How many times each layer body has run (forward plus recompute) since construction."""
        return {
            f"{stack}.{i}": layer.body_calls
            for stack, layers in (("prefix_layers", self.prefix_layers), ("expert_layers", self.expert_layers))
            for i, layer in enumerate(layers)
        }


def build_model(
    cell: Mapping[str, object],
    *,
    dropout: float = 0.0,
    dtype: torch.dtype = torch.float32,
    prefix_layer: type[DecoderLayer] = PrefixLayer,
    expert_layer: type[DecoderLayer] = ExpertLayer,
    cache_type: type[KVCache] = KVCache,
) -> PrefixExpertDecoder:
    """Model factory (component ``model``): the reference decoder for a cell, on CPU, in ``dtype``.

    Reads ``cell["attn"]`` ("sdpa" | "eager") and, if the cell has it, ``cell["sdpa_backend"]``.
    Parameters come from the global RNG, so callers seed it (``torch.manual_seed``) first.
    Checkpointing starts off; ``torchmatrix.models.parallel.parallelize`` switches it per layer. A
    cell that compiles, steps an optimizer implementation other than the default, shards over a 2-D
    mesh or pipelines gets the shallower decoder, a cell with a ``layers_per_stack`` value that many layers a stack
    (``layers_per_stack``).
    """
    config = DecoderConfig(
        attn=str(cell["attn"]),
        sdpa_backend=cell.get("sdpa_backend"),
        dropout=dropout,
        layers_per_stack=layers_per_stack(cell),
    )
    return PrefixExpertDecoder(config, prefix_layer=prefix_layer, expert_layer=expert_layer, cache_type=cache_type).to(
        dtype
    )


def layers_per_stack(cell: Mapping[str, object]) -> int:
    """How deep each stack of the cell's decoder is: the cell's own ``layers_per_stack`` where it has one
    (an axis or an include of that name deepens or flattens the reference decoder per cell), else
    ``INDUCTOR_LAYERS_PER_STACK`` where Inductor compiles its blocks, ``SHALLOW_LAYERS_PER_STACK`` where
    another backend does (``compile``), whose compile time on CPU is most of the cell's, or where it steps
    an implementation other than the default (``optimizer_impl``: forloop, foreach, fused, the compiled
    step), shards over a 2-D mesh (``mesh``: every layer is split and sharded alike, over four ranks) or
    splits it into pipeline stages (``pipeline``: four stages of one layer each under the interleaved
    schedule), else ``LAYERS_PER_STACK``. Read from the cell alone, never the world: the single-process reference
    builds it in a world of one."""
    if DEPTH_AXIS in cell:
        return cell[DEPTH_AXIS]
    mode = compile_mode(cell)
    if mode is not None and mode[0] == DEFAULT_BACKEND:
        return INDUCTOR_LAYERS_PER_STACK
    shallow = (
        mode is not None
        or implementation_of(cell) != DEFAULT_IMPLEMENTATION
        or mesh_kind(cell) != FLAT
        or pipelines(cell)
    )
    return SHALLOW_LAYERS_PER_STACK if shallow else LAYERS_PER_STACK


def make_batch(model: PrefixExpertDecoder, *, seed: int, device: torch.device) -> dict[str, Tensor]:
    """Batch factory (component ``batch``): keyword arguments for ``model(**batch)``.

    Random token ids from a generator seeded with ``seed`` (pass one per rank), so a batch
    is reproducible without touching the global RNG that dropout draws from.
    """
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    shape = (config.batch_size, config.prefix_len + config.suffix_len)
    return {"tokens": torch.randint(config.vocab_size, shape, generator=generator).to(device)}
