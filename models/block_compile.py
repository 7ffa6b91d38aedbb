"""Compile a model per decoder block as the training stacks do (cell keys ``compile`` and ``compile_nesting``).

torchtitan's order: tensor parallel, activation checkpointing, ``torch.compile`` per block, then FSDP.
``compile_nesting = "outside"`` (the default) replaces each block by ``torch.compile(block)``, so the
checkpoint inside the block is traced into the block's graph and recompute runs in the compiled
backward (state-dict keys gain ``_orig_mod.``, as torchtitan's do). ``"inside"`` compiles the
block's ``compute``, which the function the block checkpoints calls, so eager checkpointing reruns
a compiled function during backward: the nesting of pytorch#166926. The two fail differently, so each is a cell.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from torchmatrix.components.compile_axis import COMPILE_AXIS, NOT_COMPILED

NESTINGS = ("outside", "inside")
GRAPHS_PER_BLOCK = 8
"""A block's graphs in one process: the suites build it checkpointed and not, with dropout and
without, and each compiles static and, once a sequence length changes, dynamic."""


def compile_mode(cell: Mapping[str, object]) -> tuple[str, str] | None:
    """The cell's (backend, nesting), or None for an eager cell; any backend name passes through to torch.compile."""
    backend = str(cell.get(COMPILE_AXIS, NOT_COMPILED))
    if backend == NOT_COMPILED:
        return None
    nesting = str(cell.get("compile_nesting", NESTINGS[0]))
    if nesting not in NESTINGS:
        raise ValueError(f"cell axis compile_nesting={nesting!r}: expected one of {', '.join(NESTINGS)}")
    return backend, nesting


def compile_blocks(model: nn.Module, cell: Mapping[str, object]) -> None:
    """Compile each of ``model.decoder_layers()`` in place under the cell's compile mode, with
    ``fullgraph=True`` as torchtitan does: a graph break is an error naming its cause, not a silent
    fall back to eager for part of the block."""
    mode = compile_mode(cell)
    if mode is None:
        return
    backend, nesting = mode
    layers = model.decoder_layers()
    allow_graphs_for(len(layers))
    for layer in layers:
        if nesting == "outside":
            replace_module(model, layer, torch.compile(layer, backend=backend, fullgraph=True))
        elif callable(getattr(layer, "compute", None)):
            layer.compute = torch.compile(layer.compute, backend=backend, fullgraph=True)
        else:
            raise ValueError(
                f'compile_nesting="inside" compiles what a block computes inside its checkpointed region, its '
                f'`compute` method, and {type(layer).__name__} has none: give the layer a `compute` or use compile_nesting="outside"'
            )


def allow_graphs_for(blocks: int) -> None:
    """Raise Dynamo's per-function recompile limit to what per-block compile needs, as stacks that
    compile per block do: every block shares one ``forward`` whose guards specialise on each block
    (its index, the cache it finds), so the default of 8 graphs is hit by the blocks themselves and,
    under ``fullgraph=True``, fails the step."""
    needed = GRAPHS_PER_BLOCK * blocks
    if torch._dynamo.config.recompile_limit < needed:
        torch._dynamo.config.recompile_limit = needed


def replace_module(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    """Put ``new`` where ``model`` holds ``old`` (a child of some submodule, a ModuleList entry included)."""
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is old:
                parent.register_module(name, new)
                return
    raise ValueError(f"{type(old).__name__} from decoder_layers() is not a submodule of the model")
