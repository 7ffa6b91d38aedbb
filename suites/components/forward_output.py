"""What the user's model returned during a training step, however the step reached it: `model(batch)`
through any wrappers, or one of the model's own methods (`model.training_step(batch)`) that calls its
submodules itself, where no hook on the model's `__call__` ever fires. Only modules below the wrappers
are watched: FSDP1, DDP and a trainer's wrapper may rebuild what they return, so a cache read from
their output would be a copy recompute never writes to."""

from __future__ import annotations

from contextlib import contextmanager

from torch import nn

from torchmatrix.testing import user_model

from .model_output import cache_on

OUTPUT = "output"


def is_compiled(module: nn.Module) -> bool:
    """Whether calling `module` runs compiled code: torch.compile's wrapper (`_orig_mod`) or `module.compile()`."""
    return "_orig_mod" in module._modules or getattr(module, "_compiled_call_impl", None) is not None


def compiles_its_children(module: nn.Module) -> bool:
    """Whether `module` calls its children from compiled code: it is compiled, or holds a compiled
    function (`self.compute = torch.compile(self.compute)`)."""
    return is_compiled(module) or any(
        hasattr(value, "_torchdynamo_orig_callable") for value in vars(module).values() if callable(value)
    )


def watchable_modules(model: nn.Module) -> list[nn.Module]:
    """The user's model and every module below it that runs outside compiled code: a hook inside a
    compiled block would be traced into its graph (and recompile it once removed)."""
    found, pending = [], [user_model(model)]
    while pending:
        module = pending.pop()
        if getattr(module, "_compiled_call_impl", None) is not None:
            continue
        found.append(module)
        if not compiles_its_children(module):
            pending.extend(module.children())
    return found


@contextmanager
def model_output(model: nn.Module):
    """Holds, under OUTPUT, what the model returned during the block: the last output of the outermost
    watchable module call that carries a `past_key_values`, else of the outermost call (a step's own
    method, run as the model's forward by a trainer's wrapper, may return the loss alone while the
    module it calls returns the cache); nothing there when the step ran none of them."""
    seen: dict[str, object] = {}
    depth = [0]
    cache_depth: list[int] = []

    def enter(_module, _args):
        depth[0] += 1

    def leave(_module, _args, output):
        depth[0] -= 1
        if cache_on(output) is not None and depth[0] <= min(cache_depth, default=depth[0]):
            cache_depth[:] = [depth[0]]
            seen[OUTPUT] = output
        elif depth[0] == 0 and not cache_depth:
            seen[OUTPUT] = output

    handles = []
    for module in watchable_modules(model):
        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave, always_call=True))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()
