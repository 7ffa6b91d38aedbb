"""Known-bad models for grad_ckpt's eager-twin check: each computes something else once compiled.

Every one is consistent with itself: checkpointed or not under one backend, straight or resumed, eager
or compiled, so grad_ckpt's other tests and resume pass it. Only a compiled step compared with the same
step run eagerly (suites/references/eager_twin.py) sees it. Four classes, several shapes each:

- a buffer updated only when not compiling (``torch.compiler.is_compiling()``): a call counter, a
  running statistic;
- a value Dynamo bakes in at the first trace, with no guard to notice it change: a warm-up factor read
  through ``torch.compiler.assume_constant_result``, a module-level schedule read inside a function
  ``torch.compiler.allow_in_graph`` puts in the graph unread;
- a branch on a Python-side flag the compiled graph froze, read the same two ways;
- another op under ``is_compiling()``: the tanh GELU, a skipped scale, a cache read detached;
- one that needs depth: a cache entry memoised from the first layer traced, read by every later one.

What changes between steps is a step count that advances once per backward (``count_steps``), kept in
a persistent buffer and read outside the checkpointed body: every forward of one step (micro-batches,
another sequence length, recompute) and every graph Dynamo traces during it sees the same count, and a
resumed run restores it. A count advanced per forward would not do: Dynamo traces a block's static and
dynamic graphs at different forwards, so the checkpointed and plain steps would bake different values
and grad_ckpt would catch them by accident. ``graph_breaking_model`` with ``fullgraph_false_parallelize`` is the valid control: a benign graph
break compiled with ``fullgraph=False`` must stay green.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from ..block_compile import allow_graphs_for, compile_mode, replace_module
from ..parallel import parallelize
from ..transformer import (
    DecoderConfig,
    DecoderOutput,
    ExpertLayer,
    KVCache,
    PrefixExpertDecoder,
    PrefixLayer,
    attend,
    build_model,
    layers_per_stack,
)

WARMUP_STEPS = 4
"""Steps over which the warm-up mutant ramps its residual branch in (a learning-rate warm-up's shape)."""
SCHEDULE = {"temperature": 1.0, "gate": False}
"""The module-level schedule the root's forward sets from its step buffer and the in-graph helpers read."""


class CallCountingLayer(PrefixLayer):
    """Counts its calls in a buffer, but not under the compiler, as a stack that keeps a statistic out of
    its graph to avoid a recompile or a graph break does."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, hidden: Tensor, cache: KVCache) -> Tensor:
        if not torch.compiler.is_compiling():
            with torch.no_grad():
                self.calls += 1
        return super().forward(hidden, cache)


class RunningStatisticLayer(PrefixLayer):
    """Keeps a running mean square of its input for evaluation (as BatchNorm keeps running statistics),
    updated only when not compiling."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.register_buffer("input_mean_square", torch.ones(()))

    def forward(self, hidden: Tensor, cache: KVCache) -> Tensor:
        if self.training and not torch.compiler.is_compiling():
            with torch.no_grad():
                self.input_mean_square.lerp_(hidden.detach().pow(2).mean().to(self.input_mean_square.dtype), 0.1)
        return super().forward(hidden, cache)


def count_steps(module, counted: Tensor) -> None:
    """Give ``module`` a persistent ``steps`` buffer that advances once per backward, when ``counted``'s
    gradient is accumulated (a post-accumulate-grad hook, as optimizer-in-backward steps do): every forward
    of one step, micro-batches and recompute included, reads the same count, and a resumed run restores it."""
    module.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def advance(_parameter: Tensor) -> None:
        with torch.no_grad():
            module.steps += 1

    counted.register_post_accumulate_grad_hook(advance)


class StepCountingLayer(PrefixLayer):
    """A prefix layer that counts its training steps; its subclasses shape the residual branch by the count,
    outside the checkpointed body, so recompute reruns what forward ran."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        count_steps(self, self.attn_norm.weight)

    def forward(self, hidden: Tensor, cache: KVCache) -> Tensor:
        return self.shaped(hidden, super().forward(hidden, cache))

    def shaped(self, hidden: Tensor, out: Tensor) -> Tensor:
        raise NotImplementedError


class ConstantWarmupLayer(StepCountingLayer):
    """Ramps its residual branch in over WARMUP_STEPS steps; the factor comes from a method marked
    ``assume_constant_result`` ("constant for the run"), which Dynamo calls once, at the first trace."""

    @torch.compiler.assume_constant_result
    def warmup(self) -> float:
        return min(1.0, (int(self.steps) + 1) / WARMUP_STEPS)

    def shaped(self, hidden: Tensor, out: Tensor) -> Tensor:
        return hidden + self.warmup() * (out - hidden)


class ConstantFlagLayer(StepCountingLayer):
    """Trains its block frozen (gradients stopped at its residual branch) until its first step is done,
    the switch read through ``assume_constant_result``: the compiled block stays frozen."""

    @torch.compiler.assume_constant_result
    def unfrozen(self) -> bool:
        return int(self.steps) >= 1

    def shaped(self, hidden: Tensor, out: Tensor) -> Tensor:
        return out if self.unfrozen() else hidden + (out - hidden).detach()


def tempered(branch: Tensor) -> Tensor:
    """A residual branch divided by the schedule's temperature, read when the function runs."""
    return branch / SCHEDULE["temperature"]


def gated(hidden: Tensor) -> Tensor:
    """The block's output through a SiLU gate once the schedule switches it on."""
    return hidden * torch.sigmoid(hidden) if SCHEDULE["gate"] else hidden


torch.compiler.allow_in_graph(tempered)
torch.compiler.allow_in_graph(gated)


class TemperedLayer(PrefixLayer):
    """Passes its residual branch through ``tempered``, which Dynamo puts in the graph without reading it;
    the backend then traces it once and keeps the temperature it read."""

    def forward(self, hidden: Tensor, cache: KVCache) -> Tensor:
        return hidden + tempered(super().forward(hidden, cache) - hidden)


class GatedLayer(PrefixLayer):
    """Passes its output through ``gated``, whose branch on the schedule's flag the backend traces once."""

    def forward(self, hidden: Tensor, cache: KVCache) -> Tensor:
        return gated(super().forward(hidden, cache))


class ScheduledDecoder(PrefixExpertDecoder):
    """Sets the module-level schedule from its step count before each forward (temperature 1, 2, 3, ...;
    the gate on from the second step), as a trainer's scheduler would."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        count_steps(self, self.embed.weight)

    def forward(self, tokens: Tensor, past_key_values: KVCache | None = None) -> DecoderOutput:
        SCHEDULE.update(temperature=1.0 + int(self.steps), gate=int(self.steps) >= 1)
        return super().forward(tokens, past_key_values)


class TanhGeluLayer(PrefixLayer):
    """Uses the tanh approximation of GELU when compiling (a "faster" activation for the compiler)."""

    def compute(self, hidden: Tensor, cache: KVCache) -> Tensor:
        if not torch.compiler.is_compiling():
            return super().compute(hidden, cache)
        normed = self.attn_norm(hidden)
        query, key, value = (self.split_heads(proj(normed)) for proj in (self.q_proj, self.k_proj, self.v_proj))
        keys, values = self.keys_values(cache, key, value)
        attended = attend(query, keys, values, self.config).transpose(1, 2).flatten(2)
        hidden = hidden + self.dropout(self.o_proj(attended))
        mlp = self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(hidden)), approximate="tanh"))
        return hidden + self.dropout(mlp)


RESIDUAL_SCALE = 0.5
"""The scale a depth-scaled residual puts on its block's branch."""


class ScaledResidualLayer(PrefixLayer):
    """Scales its residual branch by RESIDUAL_SCALE, a step skipped under the compiler."""

    def forward(self, hidden: Tensor, cache: KVCache) -> Tensor:
        out = super().forward(hidden, cache)
        return out if torch.compiler.is_compiling() else hidden + RESIDUAL_SCALE * (out - hidden)


class DetachedCacheExpertLayer(ExpertLayer):
    """Reads the prefix layer's cache entry detached when compiling: the same loss, and no gradient from
    the expert reaches the prefix's keys and values."""

    def keys_values(self, cache: KVCache, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        if not torch.compiler.is_compiling():
            return super().keys_values(cache, key, value)
        prefix_keys, prefix_values = cache[self.layer_idx]
        return torch.cat((prefix_keys.detach(), key), dim=2), torch.cat((prefix_values.detach(), value), dim=2)


FIRST_ENTRY: list[int] = []


@torch.compiler.assume_constant_result
def prefix_entry(layer_idx: int) -> int:
    """The prefix cache entry an expert layer reads, memoised from the first call ("the layers are
    alike"): Dynamo calls it once per trace and bakes the result in, so every expert layer traced
    after the first reads the first one's entry."""
    if not FIRST_ENTRY:
        FIRST_ENTRY.append(layer_idx)
    return FIRST_ENTRY[0]


class FirstEntryExpertLayer(ExpertLayer):
    """Reads the prefix cache entry `prefix_entry` names when compiling, its own when not. A bug that
    needs depth: with one layer per stack every index is 0 and the compiled model is the eager one."""

    def keys_values(self, cache: KVCache, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        if not torch.compiler.is_compiling():
            return super().keys_values(cache, key, value)
        prefix_keys, prefix_values = cache[prefix_entry(self.layer_idx)]
        return torch.cat((prefix_keys, key), dim=2), torch.cat((prefix_values, value), dim=2)


class GraphBreakingLayer(PrefixLayer):
    """Breaks the graph before its body, as a block that logs or calls an untraceable helper does: benign
    where the block is compiled with ``fullgraph=False``."""

    def forward(self, hidden: Tensor, cache: KVCache) -> Tensor:
        torch._dynamo.graph_break()
        return super().forward(hidden, cache)


def scheduled_model(cell: Mapping[str, object], prefix_layer: type[PrefixLayer], *, dropout: float, dtype):
    """The reference decoder as ScheduledDecoder, with ``prefix_layer``, as deep as build_model makes it."""
    config = DecoderConfig(
        attn=str(cell["attn"]),
        sdpa_backend=cell.get("sdpa_backend"),
        dropout=dropout,
        layers_per_stack=layers_per_stack(cell),
    )
    return ScheduledDecoder(config, prefix_layer=prefix_layer).to(dtype)


def eager_counting_model(cell: Mapping[str, object], **kwargs) -> PrefixExpertDecoder:
    """Model factory: prefix layers count their calls in a buffer except when compiled."""
    return build_model(cell, prefix_layer=CallCountingLayer, **kwargs)


def eager_statistic_model(cell: Mapping[str, object], **kwargs) -> PrefixExpertDecoder:
    """Model factory: prefix layers update a running statistic except when compiled."""
    return build_model(cell, prefix_layer=RunningStatisticLayer, **kwargs)


def constant_warmup_model(cell: Mapping[str, object], **kwargs) -> PrefixExpertDecoder:
    """Model factory: prefix layers ramp in with a factor Dynamo bakes in at its first trace."""
    return build_model(cell, prefix_layer=ConstantWarmupLayer, **kwargs)


def constant_flag_model(cell: Mapping[str, object], **kwargs) -> PrefixExpertDecoder:
    """Model factory: prefix layers unfreeze on a flag Dynamo bakes in at its first trace."""
    return build_model(cell, prefix_layer=ConstantFlagLayer, **kwargs)


def tempered_model(cell: Mapping[str, object], *, dropout: float = 0.0, dtype=torch.float32) -> PrefixExpertDecoder:
    """Model factory: prefix layers divide by a scheduled temperature the backend traces once."""
    return scheduled_model(cell, TemperedLayer, dropout=dropout, dtype=dtype)


def gated_model(cell: Mapping[str, object], *, dropout: float = 0.0, dtype=torch.float32) -> PrefixExpertDecoder:
    """Model factory: prefix layers gate on a scheduled flag the backend traces once."""
    return scheduled_model(cell, GatedLayer, dropout=dropout, dtype=dtype)


def tanh_gelu_model(cell: Mapping[str, object], **kwargs) -> PrefixExpertDecoder:
    """Model factory: prefix layers use the tanh GELU when compiled."""
    return build_model(cell, prefix_layer=TanhGeluLayer, **kwargs)


def unscaled_residual_model(cell: Mapping[str, object], **kwargs) -> PrefixExpertDecoder:
    """Model factory: prefix layers skip their residual scale when compiled."""
    return build_model(cell, prefix_layer=ScaledResidualLayer, **kwargs)


def detached_cache_model(cell: Mapping[str, object], **kwargs) -> PrefixExpertDecoder:
    """Model factory: expert layers read the prefix cache detached when compiled."""
    return build_model(cell, expert_layer=DetachedCacheExpertLayer, **kwargs)


def first_entry_model(cell: Mapping[str, object], **kwargs) -> PrefixExpertDecoder:
    """Model factory: compiled expert layers past the first read the first one's prefix cache entry."""
    return build_model(cell, expert_layer=FirstEntryExpertLayer, **kwargs)


def graph_breaking_model(cell: Mapping[str, object], **kwargs) -> PrefixExpertDecoder:
    """Model factory (the valid control): prefix layers with a benign graph break."""
    return build_model(cell, prefix_layer=GraphBreakingLayer, **kwargs)


def fullgraph_false_parallelize(model, cell, *, device, activation_checkpointing: bool = False, mesh=None):
    """Component ``parallelize`` (the control's): the reference one, except that the blocks are compiled with
    ``fullgraph=False``, so a graph break splits a block's graph instead of failing it. Without FSDP
    only, where compiling comes last."""
    if cell["fsdp"] != "none":
        raise ValueError("fullgraph_false_parallelize compiles after parallelize: fsdp = none only")
    model = parallelize(
        model, {**cell, "compile": "none"}, device=device, activation_checkpointing=activation_checkpointing
    )
    backend, _ = compile_mode(cell)
    allow_graphs_for(len(model.decoder_layers()))
    for layer in model.decoder_layers():
        replace_module(model, layer, torch.compile(layer, backend=backend, fullgraph=False))
    return model
