"""The reference decoder in the forms real stacks write, with nothing added for the suites: its
checkpoint unit is a function (``checkpoint(self._run_layer, i, hidden, cache)``), its KV cache a
dict of dicts (layer -> {"key_states", "value_states"}) that forward keeps in a local variable and
never returns, its forward returns the loss tensor, and it has no ``body_calls()`` or
``decoder_layers()``. The grad-ckpt suite counts recompute and finds the cache itself
(suites/recompute/checkpoint_units.py); the mutants in models/mutants/grad_ckpt.py break it there.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .transformer import DecoderConfig, ExpertLayer, PrefixLayer


class DictCachePrefixLayer(PrefixLayer):
    """Writes ``cache[layer_idx] = {"key_states": ..., "value_states": ...}`` (overwrite)."""

    def keys_values(self, cache: dict, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        cache[self.layer_idx] = {"key_states": key, "value_states": value}
        return key, value


class DictCacheExpertLayer(ExpertLayer):
    """Attends over prefix layer ``layer_idx``'s dict entry plus its own keys/values."""

    def keys_values(self, cache: dict, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        entry = cache[self.layer_idx]
        return torch.cat((entry["key_states"], key), dim=2), torch.cat((entry["value_states"], value), dim=2)


class FunctionUnitDecoder(nn.Module):
    """Embedding, prefix and expert stacks run through ``self._run_layer`` (checkpointed when
    ``gradient_checkpointing`` is on and training), a next-token head; forward returns the loss."""

    def __init__(
        self,
        config: DecoderConfig,
        prefix_layer: type[PrefixLayer] = DictCachePrefixLayer,
        expert_layer: type[ExpertLayer] = DictCacheExpertLayer,
    ) -> None:
        super().__init__()
        self.config = config
        self.gradient_checkpointing = False
        self.embed = nn.Embedding(config.vocab_size, config.width)
        depth = config.layers_per_stack
        self.layers = nn.ModuleList([*(prefix_layer(config, i) for i in range(depth))])
        self.layers.extend(expert_layer(config, i) for i in range(depth))
        self.final_norm = nn.RMSNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab_size, bias=False)

    def _run_layer(self, i: int, hidden: Tensor, cache: dict) -> Tensor:
        return self.layers[i].compute(hidden, cache)

    def run_layer(self, i: int, hidden: Tensor, cache: dict) -> Tensor:
        """Layer ``i`` on ``hidden``, through ``torch.utils.checkpoint`` when checkpointing."""
        if self.gradient_checkpointing and self.training:
            return checkpoint(self._run_layer, i, hidden, cache, use_reentrant=False)
        return self._run_layer(i, hidden, cache)

    def forward(self, tokens: Tensor) -> Tensor:
        cache: dict[int, dict[str, Tensor]] = {}
        embedded = self.embed(tokens)
        prefix, suffix = embedded[:, : self.config.prefix_len], embedded[:, self.config.prefix_len :]
        depth = self.config.layers_per_stack
        for i in range(depth):
            prefix = self.run_layer(i, prefix, cache)
        for i in range(depth, 2 * depth):
            suffix = self.run_layer(i, suffix, cache)
        logits = self.head(self.final_norm(torch.cat((prefix, suffix), dim=1)))
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


def build_function_unit_model(
    cell: Mapping[str, object],
    *,
    dropout: float = 0.0,
    dtype: torch.dtype = torch.float32,
    decoder: type[FunctionUnitDecoder] = FunctionUnitDecoder,
    **layers,
) -> FunctionUnitDecoder:
    """Model factory (component ``model``): the function-unit decoder (or ``decoder``, a subclass) for a
    cell, on CPU, in ``dtype``; ``layers`` picks its prefix and expert layer classes."""
    config = DecoderConfig(attn=str(cell["attn"]), sdpa_backend=cell.get("sdpa_backend"), dropout=dropout)
    return decoder(config, **layers).to(dtype)


def parallelize_function_units(
    model: FunctionUnitDecoder, cell: Mapping[str, object], *, device: torch.device, activation_checkpointing=False
) -> nn.Module:
    """Component ``parallelize`` for cells without FSDP: switch checkpointing, move to ``device``."""
    model.gradient_checkpointing = activation_checkpointing
    return model.to(device)


class Bfloat16ComputeDecoder(FunctionUnitDecoder):
    """float32 parameters, bfloat16 compute chosen inside forward (autocast), declared as
    ``compute_dtype`` so the suite compares at bfloat16's precision and says so."""

    compute_dtype = torch.bfloat16

    def forward(self, tokens: Tensor) -> Tensor:
        with torch.autocast(tokens.device.type, dtype=self.compute_dtype):
            return super().forward(tokens)


def build_bfloat16_compute_model(
    cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> Bfloat16ComputeDecoder:
    """Model factory: the function-unit decoder computing in bfloat16 under float32 parameters."""
    return build_function_unit_model(cell, dropout=dropout, dtype=dtype, decoder=Bfloat16ComputeDecoder)
