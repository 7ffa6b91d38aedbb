"""Known-bad components for the grad-ckpt suite's compiled cells: a block whose compiled recompute is
not the graph its forward ran, a parallelize that compiles blocks it never checkpointed, and blocks
whose selective-checkpoint policy saves every op.

Its checkpointed body branches on a Python counter that forward advances after the body ran, as a
block reading a per-call schedule (a warm-up step, a position offset) from an attribute does. Torch
compile guards on the counter, so with ``compile_nesting = "inside"`` the backward's recompute fails
the guard and runs a graph compiled for the new value, which saves other tensors than the forward's:
torch raises ``CheckpointError``, the class of pytorch#166926 (a recompute that selects another
compiled graph than its forward). Eager checkpointing reruns the same Python and fails the same way.
With ``compile_nesting = "outside"`` recompute runs inside the graph the forward traced, so the
block is consistent there.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from torch import Tensor
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from ..parallel import parallelize
from ..transformer import ExpertLayer, KVCache, PrefixExpertDecoder, PrefixLayer, build_model


class CallCountingPrefixLayer(PrefixLayer):
    """Counts its calls after the checkpointed body has run, and from the second call on adds a
    ``sin`` (which saves its input for backward) to what the body computes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls_finished = 0

    def forward(self, hidden: Tensor, cache: KVCache) -> Tensor:
        hidden = super().forward(hidden, cache)
        self.calls_finished += 1
        return hidden

    def compute(self, hidden: Tensor, cache: KVCache) -> Tensor:
        hidden = super().compute(hidden, cache)
        if self.calls_finished:
            hidden = hidden + 1e-3 * hidden.sin()
        return hidden


def recompute_switching_model(cell: Mapping[str, object], **kwargs) -> PrefixExpertDecoder:
    """Model factory: the reference decoder whose prefix layers switch graphs between forward and recompute."""
    return build_model(cell, prefix_layer=CallCountingPrefixLayer, **kwargs)


def checkpoint_dropping_parallelize(model, cell, *, device, activation_checkpointing: bool = False, mesh=None):
    """Component ``parallelize``: the reference one, except that it never switches checkpointing on,
    as a stack whose compile wrapper replaces the checkpointed blocks would. In an eager cell no layer
    body runs again; in a compiled cell, where none runs again anyway, autograd saves as much with
    checkpointing as without, and the suite must fail saying checkpointing was not applied."""
    return parallelize(model, cell, device=device, activation_checkpointing=False, mesh=mesh)


def save_every_op(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """A selective-checkpoint policy that keeps every op's output: nothing is left to recompute."""
    return CheckpointPolicy.MUST_SAVE


SAVING_EVERY_OP = partial(create_selective_checkpoint_contexts, save_every_op)
"""A module-level context function: Dynamo traces a partial of one, not a closure."""


def saving_every_op(self, function, *args):
    """``DecoderLayer.checkpointed`` under the policy that saves every op."""
    return checkpoint(function, *args, use_reentrant=False, context_fn=SAVING_EVERY_OP)


class SavingPrefixLayer(PrefixLayer):
    checkpointed = saving_every_op


class SavingExpertLayer(ExpertLayer):
    checkpointed = saving_every_op


def every_op_saving_model(cell: Mapping[str, object], **kwargs) -> PrefixExpertDecoder:
    """Model factory: the reference decoder checkpointed under a selective-checkpoint policy that saves
    every op, as a stack whose policy list grew to cover them all. Checkpointing is applied (autograd
    saves more than without it: the saved outputs and the region's own), and recomputes nothing; in a
    compiled cell the suite must fail saying so, not that checkpointing was never switched on."""
    return build_model(cell, prefix_layer=SavingPrefixLayer, expert_layer=SavingExpertLayer, **kwargs)
