"""Known-bad models for the grad-ckpt suite: each makes checkpoint recompute disagree with forward.

All three are identical to the reference decoder without checkpointing and only go wrong
when a layer body runs a second time during backward: the bug class the grad-ckpt suite
exists for. Point matrix.toml's ``model`` component at one of the factories below and
suites/test_grad_ckpt.py must fail.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from models.transformer import ExpertLayer, KVCache, PrefixExpertDecoder, PrefixLayer, build_model


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


class LatestEntryPrefixLayer(PrefixLayer):
    """Attends over the most recently added cache entry, assuming it is its own.

    True during forward; during backward the layers recompute in reverse order after the whole
    stack has written, so the latest entry belongs to a LATER layer.
    """

    def keys_values(self, cache: KVCache, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        cache[self.layer_idx] = (key, value)
        return list(cache.values())[-1]


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
