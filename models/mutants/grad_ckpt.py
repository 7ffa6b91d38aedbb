"""Known-bad models for the grad-ckpt suite: each makes checkpoint recompute disagree with forward.

All of them are identical to the reference decoder without checkpointing and only go wrong
when a layer body runs a second time during backward: the bug class the grad-ckpt suite
exists for. Point matrix.toml's ``model`` component at one of the factories below and
suites/test_grad_ckpt.py must fail. Two factories at the end are not bugs but a model that
lacks what some checks need (no cache, no dropout), on which those checks must skip, not pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..function_units import DictCachePrefixLayer, FunctionUnitDecoder, build_function_unit_model
from ..transformer import (
    DecoderConfig,
    DecoderOutput,
    ExpertLayer,
    KVCache,
    PrefixExpertDecoder,
    PrefixLayer,
    attend,
    build_model,
)


class AppendingPrefixLayer(PrefixLayer):
    """Appends to its cache entry instead of overwriting it (a decode-style cache update).

    Forward starts from an empty cache, so nothing changes there; recompute finds the entry
    already present and attends over the keys/values twice.
    """

    def keys_values(self, cache: KVCache, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        if self.layer_idx in cache:
            cached_key, cached_value = cache[self.layer_idx]
            key, value = torch.cat((cached_key, key), dim=2), torch.cat((cached_value, value), dim=2)
        cache[self.layer_idx] = (key, value)
        return key, value


class PlainDictDecoder(PrefixExpertDecoder):
    """Returns as ``past_key_values`` the plain dict the layers write their entries to, as models
    that keep a ``dict`` of per-layer keys/values do. FSDP1 rebuilds the dicts in the root's output
    (to hook its tensors for backward), so under FSDP1 the dict returned is a copy made after
    forward, which recompute never writes to."""

    def forward(self, tokens: Tensor, past_key_values: KVCache | None = None) -> DecoderOutput:
        loss, cache = super().forward(tokens, past_key_values)
        return DecoderOutput(loss, cache._entries)


class CacheCopyDecoder(PrefixExpertDecoder):
    """Returns a copy of its cache taken right after forward: no check can see what recompute wrote,
    so the suite must fail saying so rather than pass having compared nothing."""

    def forward(self, tokens: Tensor, past_key_values: KVCache | None = None) -> DecoderOutput:
        loss, cache = super().forward(tokens, past_key_values)
        return DecoderOutput(loss, dict(cache.items()))


class ReappendingPrefixLayer(PrefixLayer):
    """Appends its keys/values to its cache entry on every run and attends over the latest pair.

    Forward leaves ``(keys, values)``; recompute makes it ``(keys, values, keys, values)``: gradients
    and losses are unchanged, only the cache grows, so only a check that sees the cache the recompute
    wrote to can catch it.
    """

    def keys_values(self, cache: KVCache, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        cache[self.layer_idx] = cache.get(self.layer_idx, ()) + (key, value)
        return key, value


class LatestEntryPrefixLayer(PrefixLayer):
    """Attends over the most recently added cache entry, assuming it is its own.

    True during forward; during backward the layers recompute in reverse order after the whole
    stack has written, so the latest entry belongs to a LATER layer.
    """

    def keys_values(self, cache: KVCache, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        cache[self.layer_idx] = (key, value)
        return list(cache.values())[-1]


class RunCountingPrefixLayer(PrefixLayer):
    """Counts its body runs in a buffer (a routing or token counter kept inside the layer): recompute
    counts a second time, so the buffer ends a checkpointed step one ahead of eager."""

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.register_buffer("body_runs", torch.zeros((), dtype=torch.int64))

    def body(self, hidden: Tensor, cache: KVCache) -> Tensor:
        with torch.no_grad():
            self.body_runs += 1
        return super().body(hidden, cache)


class WriteCountingKVCache(KVCache):
    """A cache that counts writes in a plain int, like a ``seen_tokens`` counter: every recomputed
    prefix layer writes its entry again and bumps the counter, tensors left as they were."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def __setitem__(self, layer_idx: int, keys_values: tuple[Tensor, Tensor]) -> None:
        self.writes += 1
        super().__setitem__(layer_idx, keys_values)


class ModuleHeldCacheDecoder(PrefixExpertDecoder):
    """Keeps one KV cache on the module for every call instead of a new one per forward (a cache held
    for decoding). Right for one forward then its backward; with two micro-batches forward before one
    backward, micro-batch 1's expert layers recompute over the prefix keys micro-batch 2 wrote."""

    def __init__(self, config: DecoderConfig, **kwargs) -> None:
        super().__init__(config, **kwargs)
        self.held_cache = self.cache_type()

    def forward(self, tokens: Tensor, past_key_values: KVCache | None = None) -> DecoderOutput:
        return super().forward(tokens, self.held_cache if past_key_values is None else past_key_values)


AUX_LOSS_TRACKER: dict[str, list[Tensor]] = {}
"""A module-level registry the layer bodies add their auxiliary losses to (Megatron's aux-loss tracker)."""


@dataclass
class RoutingStats:
    """Statistics a router keeps in an object of its own on the layer."""

    tokens_routed: int = 0


class AuxLossPrefixLayer(PrefixLayer):
    """On every body run, appends an auxiliary loss to a plain list on the layer (a load-balancing loss
    a trainer sums after the step) and to the module-level `AUX_LOSS_TRACKER`, and counts the tokens it
    routed in a `RoutingStats` on the layer: recompute does each again, so each holds twice as much."""

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.aux_losses: list[Tensor] = []
        self.routing_stats = RoutingStats()
        self.tracker_key = f"prefix layer {layer_idx}"

    def body(self, hidden: Tensor, cache: KVCache) -> Tensor:
        aux_loss = hidden.detach().pow(2).mean()
        self.aux_losses.append(aux_loss)
        AUX_LOSS_TRACKER.setdefault(self.tracker_key, []).append(aux_loss)
        self.routing_stats.tokens_routed += hidden.shape[0] * hidden.shape[1]
        return super().body(hidden, cache)


class NeverCheckpointingLayer(PrefixLayer):
    """Ignores the ``checkpointing`` switch that ``parallelize`` sets: its body never reruns, so
    checkpointed and eager runs are the same computation and their comparison proves nothing."""

    def forward(self, hidden: Tensor, cache: KVCache) -> Tensor:
        return self.body(hidden, cache)


class NeverCheckpointingExpertLayer(ExpertLayer):
    """The expert-stack counterpart of ``NeverCheckpointingLayer``."""

    def forward(self, hidden: Tensor, cache: KVCache) -> Tensor:
        return self.body(hidden, cache)


class SelfAttendingPrefixLayer(PrefixLayer):
    """Attends over its own keys/values and writes no cache."""

    def keys_values(self, cache: KVCache, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        return key, value


class SelfAttendingExpertLayer(ExpertLayer):
    """Attends over its own keys/values, reading no cache."""

    def keys_values(self, cache: KVCache, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        return key, value


class CachelessDecoder(PrefixExpertDecoder):
    """A decoder without a KV cache, as torchtitan's Llama is: its layers attend over their own
    keys/values, the cache handed to them stays empty, and forward returns an empty ``past_key_values``;
    neither the output nor the cache hook has a cache for the checks to compare."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__(config, prefix_layer=SelfAttendingPrefixLayer, expert_layer=SelfAttendingExpertLayer)

    def forward(self, tokens: Tensor, past_key_values: KVCache | None = None) -> DecoderOutput:
        loss, _ = super().forward(tokens, past_key_values)
        return DecoderOutput(loss, {})


class NextUlpGradient(torch.autograd.Function):
    """Identity forward; backward moves the first element of the gradient one ULP up (its last bit)."""

    @staticmethod
    def forward(ctx, tensor: Tensor) -> Tensor:
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        grad = grad.clone()
        first = grad.view(-1)[:1]
        first.copy_(torch.nextafter(first, torch.full_like(first, float("inf"))))
        return grad


class LastBitPrefixLayer(PrefixLayer):
    """Prefix layer 0, when checkpointed, hands its output projection's weight a gradient one ULP
    off in one element: the smallest difference a float32 comparison can see. The body is the
    reference one with the output projection spelled out."""

    def body(self, hidden: Tensor, cache: KVCache) -> Tensor:
        if not (self.checkpointing and self.layer_idx == 0):
            return super().body(hidden, cache)
        self.body_calls += 1
        normed = self.attn_norm(hidden)
        query, key, value = (self.split_heads(proj(normed)) for proj in (self.q_proj, self.k_proj, self.v_proj))
        keys, values = self.keys_values(cache, key, value)
        attended = attend(query, keys, values, self.config).transpose(1, 2).flatten(2)
        projected = F.linear(attended, NextUlpGradient.apply(self.o_proj.weight))
        hidden = hidden + self.dropout(projected)
        mlp = self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(hidden))))
        return hidden + self.dropout(mlp)


class ForgetsRngState:
    """Mixin: checkpoint with ``preserve_rng_state=False``, so recompute draws new dropout masks."""

    def forward(self, hidden: Tensor, cache: KVCache) -> Tensor:
        if self.checkpointing:
            return checkpoint(self.body, hidden, cache, use_reentrant=False, preserve_rng_state=False)
        return self.body(hidden, cache)


class RngForgettingPrefixLayer(ForgetsRngState, PrefixLayer):
    """Prefix layer whose checkpoint does not restore the RNG for recompute."""


class RngForgettingExpertLayer(ForgetsRngState, ExpertLayer):
    """Expert layer whose checkpoint does not restore the RNG for recompute."""


def appending_cache_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> PrefixExpertDecoder:
    """Model factory: the reference decoder with prefix layers that append to their cache entry."""
    return build_model(cell, dropout=dropout, dtype=dtype, prefix_layer=AppendingPrefixLayer)


def reappending_cache_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> PrefixExpertDecoder:
    """Model factory: prefix layers append to their entry of a plain-dict cache again on recompute."""
    config = DecoderConfig(attn=str(cell["attn"]), sdpa_backend=cell.get("sdpa_backend"), dropout=dropout)
    return PlainDictDecoder(config, prefix_layer=ReappendingPrefixLayer).to(dtype)


def cache_copy_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> PrefixExpertDecoder:
    """Model factory: the reference decoder returning a copy of its cache instead of the cache."""
    config = DecoderConfig(attn=str(cell["attn"]), sdpa_backend=cell.get("sdpa_backend"), dropout=dropout)
    return CacheCopyDecoder(config).to(dtype)


def later_layer_cache_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> PrefixExpertDecoder:
    """Model factory: the reference decoder with prefix layers that read the latest cache entry."""
    return build_model(cell, dropout=dropout, dtype=dtype, prefix_layer=LatestEntryPrefixLayer)


def rng_forgetting_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> PrefixExpertDecoder:
    """Model factory: the reference decoder checkpointing with ``preserve_rng_state=False``."""
    return build_model(
        cell, dropout=dropout, dtype=dtype, prefix_layer=RngForgettingPrefixLayer, expert_layer=RngForgettingExpertLayer
    )


def buffer_counting_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> PrefixExpertDecoder:
    """Model factory: prefix layers count their body runs in a buffer, recompute included."""
    return build_model(cell, dropout=dropout, dtype=dtype, prefix_layer=RunCountingPrefixLayer)


def cache_counter_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> PrefixExpertDecoder:
    """Model factory: the cache bumps an int counter on every write, recompute included."""
    return build_model(cell, dropout=dropout, dtype=dtype, cache_type=WriteCountingKVCache)


def module_held_cache_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> PrefixExpertDecoder:
    """Model factory: the reference decoder keeping one KV cache on the module across calls."""
    config = DecoderConfig(attn=str(cell["attn"]), sdpa_backend=cell.get("sdpa_backend"), dropout=dropout)
    return ModuleHeldCacheDecoder(config).to(dtype)


def aux_loss_list_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> PrefixExpertDecoder:
    """Model factory: prefix layers append an auxiliary loss to a plain list attribute on every body run."""
    return build_model(cell, dropout=dropout, dtype=dtype, prefix_layer=AuxLossPrefixLayer)


def last_bit_gradient_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> PrefixExpertDecoder:
    """Model factory: checkpointing moves one element of one gradient by one ULP."""
    return build_model(cell, dropout=dropout, dtype=dtype, prefix_layer=LastBitPrefixLayer)


def never_checkpointing_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> PrefixExpertDecoder:
    """Model factory: layers that ignore ``parallelize``'s checkpointing switch."""
    return build_model(
        cell,
        dropout=dropout,
        dtype=dtype,
        prefix_layer=NeverCheckpointingLayer,
        expert_layer=NeverCheckpointingExpertLayer,
    )


def no_cache_no_dropout_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> PrefixExpertDecoder:
    """Model factory, not a bug: returns no cache and has no dropout (its ``dropout`` argument is
    accepted and unused), like torchtitan's Llama debug model. The cache checks and the dropout
    variant must skip saying so; everything else must pass."""
    config = DecoderConfig(attn=str(cell["attn"]), sdpa_backend=cell.get("sdpa_backend"))
    return CachelessDecoder(config).to(dtype)


class HistoryKeepingDictPrefixLayer(DictCachePrefixLayer):
    """Keeps every keys tensor it wrote in its dict entry's ``"history"`` list and attends over the
    latest: forward leaves one, recompute appends a second to the cache forward never returned, so
    only the cache hook can see it (gradients and losses are unchanged)."""

    def keys_values(self, cache: dict, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        history = cache.get(self.layer_idx, {}).get("history", [])
        cache[self.layer_idx] = {"key_states": key, "value_states": value, "history": [*history, key]}
        return key, value


class RngForgettingFunctionUnitDecoder(FunctionUnitDecoder):
    """Checkpoints its function unit with ``preserve_rng_state=False``: recompute draws new dropout masks."""

    def run_layer(self, i: int, hidden: Tensor, cache: dict) -> Tensor:
        if self.gradient_checkpointing and self.training:
            return checkpoint(self._run_layer, i, hidden, cache, use_reentrant=False, preserve_rng_state=False)
        return self._run_layer(i, hidden, cache)


class RunCountingFunctionUnitDecoder(FunctionUnitDecoder):
    """Counts layer runs in a plain int on the model inside the function unit, recompute included."""

    def __init__(self, config: DecoderConfig, **layers) -> None:
        super().__init__(config, **layers)
        self.layer_runs = 0

    def _run_layer(self, i: int, hidden: Tensor, cache: dict) -> Tensor:
        self.layer_runs += 1
        return super()._run_layer(i, hidden, cache)


def hidden_cache_history_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> FunctionUnitDecoder:
    """Model factory: function units over a dict-of-dicts cache never returned; recompute appends to it."""
    return build_function_unit_model(cell, dropout=dropout, dtype=dtype, prefix_layer=HistoryKeepingDictPrefixLayer)


def function_unit_rng_forgetting_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> FunctionUnitDecoder:
    """Model factory: the function unit's checkpoint does not replay the RNG for recompute."""
    return build_function_unit_model(cell, dropout=dropout, dtype=dtype, decoder=RngForgettingFunctionUnitDecoder)


def function_unit_counter_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> FunctionUnitDecoder:
    """Model factory: the function unit bumps an int on the model on every run, recompute included."""
    return build_function_unit_model(cell, dropout=dropout, dtype=dtype, decoder=RunCountingFunctionUnitDecoder)
