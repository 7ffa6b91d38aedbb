"""A tiny prefix/suffix policy, shaped like a vision-language-action model (pi0's PaliGemma with an
action expert): the stack a user brings, written as such stacks are, with nothing for torchmatrix.

A prefix stack runs over the observation tokens and writes each layer's keys and values into a
dict-of-dicts KV cache that ``forward`` keeps in a local variable; the suffix ("action expert")
stack runs over the noisy actions and its layer ``i`` attends over prefix layer ``i``'s cached keys
and values. Under gradient checkpointing every layer runs through ``self._run_layer``, a function,
not a module; ``forward`` returns the loss tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class PolicyConfig:
    vocab_size: int = 64
    action_dim: int = 6
    width: int = 32
    heads: int = 4
    depth: int = 2
    prefix_len: int = 8
    suffix_len: int = 6
    dropout: float = 0.0


class Block(nn.Module):
    """Pre-norm attention + MLP. A prefix block writes its keys and values to ``cache[slot]``; a
    suffix block attends over ``cache[slot]`` (prefix layer ``slot``'s) and its own."""

    def __init__(self, config: PolicyConfig, slot: int, writes_cache: bool) -> None:
        super().__init__()
        self.heads, self.slot, self.writes_cache = config.heads, slot, writes_cache
        self.norm = nn.RMSNorm(config.width)
        self.qkv = nn.Linear(config.width, 3 * config.width, bias=False)
        self.out = nn.Linear(config.width, config.width, bias=False)
        self.mlp = nn.Sequential(
            nn.RMSNorm(config.width),
            nn.Linear(config.width, 2 * config.width),
            nn.GELU(),
            nn.Linear(2 * config.width, config.width),
        )
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, hidden: Tensor, cache: dict[int, dict[str, Tensor]]) -> Tensor:
        batch, tokens, width = hidden.shape
        query, keys, values = (
            part.view(batch, tokens, self.heads, -1).transpose(1, 2)
            for part in self.qkv(self.norm(hidden)).chunk(3, -1)
        )
        if self.writes_cache:
            cache[self.slot] = {"key_states": keys, "value_states": values}
        else:
            keys = torch.cat((cache[self.slot]["key_states"], keys), dim=2)
            values = torch.cat((cache[self.slot]["value_states"], values), dim=2)
        attended = F.scaled_dot_product_attention(query, keys, values).transpose(1, 2).reshape(batch, tokens, width)
        hidden = hidden + self.dropout(self.out(attended))
        return hidden + self.dropout(self.mlp(hidden))


class PrefixSuffixPolicy(nn.Module):
    """Observation tokens -> prefix stack (fills the KV cache) -> action expert over the cache -> loss."""

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.config = config
        self.gradient_checkpointing = False
        self.embed = nn.Embedding(config.vocab_size, config.width)
        self.action_in = nn.Linear(config.action_dim, config.width)
        self.layers = nn.ModuleList(Block(config, i % config.depth, i < config.depth) for i in range(2 * config.depth))
        self.lm_head = nn.Linear(config.width, config.vocab_size, bias=False)
        self.action_out = nn.Linear(config.width, config.action_dim)

    def _run_layer(self, i: int, hidden: Tensor, cache: dict[int, dict[str, Tensor]]) -> Tensor:
        return self.layers[i](hidden, cache)

    def forward(self, observation: Tensor, noisy_actions: Tensor, target_actions: Tensor) -> Tensor:
        cache: dict[int, dict[str, Tensor]] = {}
        prefix, suffix = self.embed(observation), self.action_in(noisy_actions)
        for i in range(len(self.layers)):
            hidden = prefix if i < self.config.depth else suffix
            if self.gradient_checkpointing and self.training:
                hidden = checkpoint(self._run_layer, i, hidden, cache, use_reentrant=False)
            else:
                hidden = self._run_layer(i, hidden, cache)
            if i < self.config.depth:
                prefix = hidden
            else:
                suffix = hidden
        logits = self.lm_head(prefix[:, :-1])
        language_loss = F.cross_entropy(logits.flatten(0, 1).float(), observation[:, 1:].flatten())
        return language_loss + F.mse_loss(self.action_out(suffix).float(), target_actions.float())


def sample_batch(config: PolicyConfig, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
    """Observation tokens, noisy actions and the actions to predict, drawn from ``generator``."""
    actions = torch.randn(batch_size, config.suffix_len, config.action_dim, generator=generator)
    return {
        "observation": torch.randint(config.vocab_size, (batch_size, config.prefix_len), generator=generator),
        "noisy_actions": actions + torch.randn(actions.shape, generator=generator),
        "target_actions": actions,
    }
