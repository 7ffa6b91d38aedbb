"""The reference decoder split into pipeline stages (component `pipeline_split`): consecutive decoder
layers per stage, the embedding on the first stage, the final norm and head on the last. A stage sends
only tensors, so the KV cache crosses stages as tensors: each stage passes on the hidden states and
the prefix keys and values that an expert layer of a later stage reads."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import torch
from torch import Tensor, nn

from .transformer import PrefixExpertDecoder, next_token_loss


class PipelineSplit(NamedTuple):
    """What a pipelined step needs of a model: its stages in order, the first stage's inputs and the
    loss's target from a batch, and the loss of the last stage's output (one micro-batch's mean)."""

    stages: list[nn.Module]
    inputs: Callable[[Mapping[str, Tensor]], tuple[Tensor, ...]]
    target: Callable[[Mapping[str, Tensor]], Tensor]
    loss: Callable[[Tensor, Tensor], Tensor]


class ContiguousGradient(torch.autograd.Function):
    """Identity forward; backward hands on the gradient in contiguous memory (an exact copy where it is not).
    A stage sends its inputs' gradients point to point, and `torch.distributed.pipelining` receives them into
    buffers laid out as the sender's were: a strided view, such as the slice of a cat's gradient that a
    received key gets, makes gloo refuse the buffer ("input tensor has to be contiguous")."""

    @staticmethod
    def forward(ctx, tensor: Tensor) -> Tensor:
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, gradient: Tensor) -> Tensor:
        return gradient.contiguous()


class DecoderStage(nn.Module):
    """Some consecutive layers of a PrefixExpertDecoder (the model's own modules, so its names and
    parameters are the model's): prefix layers, then expert layers, as the whole forward runs them.

    It receives the token ids (first stage) or (prefix, suffix, keys and values of the prefix layers
    `entries_in`), and returns the logits (last stage) or the same with the entries `entries_out`.
    """

    def __init__(
        self,
        model: PrefixExpertDecoder,
        prefix_layers: list[nn.Module],
        expert_layers: list[nn.Module],
        *,
        first: bool,
        last: bool,
        entries_in: tuple[int, ...],
        entries_out: tuple[int, ...],
    ) -> None:
        super().__init__()
        self.config = model.config
        self.cache_type = model.cache_type
        self.embed = model.embed if first else None
        self.prefix_layers = nn.ModuleList(prefix_layers)
        self.expert_layers = nn.ModuleList(expert_layers)
        self.final_norm = model.final_norm if last else None
        self.head = model.head if last else None
        self.entries_in = entries_in
        self.entries_out = entries_out

    def decoder_layers(self) -> list[nn.Module]:
        """The stage's checkpointing and sharding units, in forward order (what `parallelize` wraps)."""
        return [*self.prefix_layers, *self.expert_layers]

    def forward(self, *received: Tensor) -> Tensor | tuple[Tensor, ...]:
        cache = self.cache_type()
        if self.embed is not None:
            (tokens,) = received
            embedded = self.embed(tokens)
            prefix, suffix = embedded[:, : self.config.prefix_len], embedded[:, self.config.prefix_len :]
        else:
            prefix, suffix, *entries = (ContiguousGradient.apply(tensor) for tensor in received)
            for position, index in enumerate(self.entries_in):
                cache[index] = (entries[2 * position], entries[2 * position + 1])
        for layer in self.prefix_layers:
            prefix = layer(prefix, cache)
        for layer in self.expert_layers:
            suffix = layer(suffix, cache)
        if self.head is not None:
            return self.head(self.final_norm(torch.cat((prefix, suffix), dim=1)))
        sent = (prefix, suffix, *(tensor for index in self.entries_out for tensor in cache[index]))
        return tuple(
            tensor.contiguous() for tensor in sent
        )  # a send needs contiguous memory (keys are transposed views)


def layer_ranges(layers: int, stages: int) -> list[range]:
    """`layers` consecutive layers over `stages` stages, the first ones one more where they do not divide."""
    if layers < stages:
        raise ValueError(f"{layers} decoder layers cannot fill {stages} pipeline stages: build a deeper decoder")
    size, extra = divmod(layers, stages)
    starts = [stage * size + min(stage, extra) for stage in range(stages + 1)]
    return [range(starts[stage], starts[stage + 1]) for stage in range(stages)]


def split_decoder(model: PrefixExpertDecoder, *, stages: int) -> PipelineSplit:
    """Component `pipeline_split`: the decoder's 2 x layers_per_stack layers over `stages` stages in forward
    order. Prefix layer i's keys and values travel from the stage that writes them to the one holding
    expert layer i, which reads them."""
    depth = len(model.prefix_layers)
    ordered = [*model.prefix_layers, *model.expert_layers]
    built, carried = [], ()
    for stage, layers in enumerate(layer_ranges(len(ordered), stages)):
        written, read = min(layers.stop, depth), max(layers.stop - depth, 0)
        passed_on = tuple(range(read, written))
        built.append(
            DecoderStage(
                model,
                [ordered[index] for index in layers if index < depth],
                [ordered[index] for index in layers if index >= depth],
                first=stage == 0,
                last=stage == stages - 1,
                entries_in=carried,
                entries_out=passed_on,
            )
        )
        carried = passed_on
    return PipelineSplit(
        stages=built,
        inputs=lambda batch: (batch["tokens"],),
        target=lambda batch: batch["tokens"],
        loss=next_token_loss,
    )
