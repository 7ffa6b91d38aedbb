"""suites/recompute/checkpoint_units.py in-process: the instrumented torch.utils.checkpoint counts each unit's
runs in forward and again in backward, names it, sees the containers forward hands it (the cache
hook), and is put back afterwards."""

from __future__ import annotations

import functools
import sys
import types

import torch
import torch.utils.checkpoint
from torch import nn

from models import function_units
from suites.recompute.checkpoint_units import ORIGINAL_CHECKPOINT, counted_checkpoints, watched_sites


class Layers(nn.Module):
    """Two linear layers checkpointed as modules, then as a partial of a module's __call__ with a cache keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, hidden: torch.Tensor, cache: list) -> torch.Tensor:
        hidden = torch.utils.checkpoint.checkpoint(self.layers[0], hidden, use_reentrant=False)
        call = functools.partial(self.layers[1].__call__)
        cache.append(hidden)
        return torch.utils.checkpoint.checkpoint(functools.partial(call, hidden), use_reentrant=False)


def test_a_function_unit_is_counted_per_call_and_its_dict_cache_observed():
    torch.manual_seed(0)
    model = function_units.build_function_unit_model({"attn": "sdpa"})
    model.gradient_checkpointing = True
    tokens = torch.randint(64, (2, 16))
    with counted_checkpoints() as units:
        loss = model(tokens)
        after_forward = units.calls(model)
        loss.backward()
        after_backward = units.calls(model)
    assert after_forward == {f"FunctionUnitDecoder._run_layer#{i}": 1 for i in range(6)}
    assert after_backward == {f"FunctionUnitDecoder._run_layer#{i}": 2 for i in range(6)}
    [(name, cache, _)] = units.containers
    assert name == "cache" and sorted(cache) == [0, 1, 2]
    assert sorted(cache[0]) == ["key_states", "value_states"]
    assert torch.utils.checkpoint.checkpoint is ORIGINAL_CHECKPOINT


def test_modules_and_partials_of_their_call_are_named_by_module_path():
    model = Layers()
    with counted_checkpoints() as units:
        model(torch.randn(2, 4, requires_grad=True), []).sum().backward()
    assert units.calls(model) == {"layers.0": 2, "layers.1": 2}
    assert units.containers == [], "a list handed to no unit is no cache"


def test_a_module_holding_its_own_reference_is_instrumented_too():
    """models/function_units.py did `from torch.utils.checkpoint import checkpoint`."""
    with counted_checkpoints():
        assert function_units.checkpoint is not ORIGINAL_CHECKPOINT
    assert function_units.checkpoint is ORIGINAL_CHECKPOINT


def test_the_run_without_checkpointing_watches_the_same_units_for_the_cache():
    """The eager model calls `_run_layer` directly; watching the checkpointed run's sites finds its cache too."""
    tokens = torch.randint(64, (2, 16))
    checkpointed = function_units.build_function_unit_model({"attn": "sdpa"})
    checkpointed.gradient_checkpointing = True
    with counted_checkpoints() as units:
        checkpointed(tokens)
    assert units.sites(checkpointed) == [("", "_run_layer")]
    eager = function_units.build_function_unit_model({"attn": "sdpa"})
    with counted_checkpoints() as watched, watched_sites(eager, units.sites(checkpointed), watched):
        eager(tokens)
    [(name, cache, _)] = watched.containers
    assert name == "cache" and sorted(cache) == [0, 1, 2]
    assert "_run_layer" not in vars(eager), "the watch is taken off after the block"


def test_a_module_imported_during_the_block_gets_the_original_back(monkeypatch):
    """A factory that imports its package lazily takes the instrumented function; it must not keep it."""
    late = types.ModuleType("late_stack")
    with counted_checkpoints():
        monkeypatch.setitem(sys.modules, "late_stack", late)
        late.checkpoint = torch.utils.checkpoint.checkpoint
        assert late.checkpoint is not ORIGINAL_CHECKPOINT
    assert late.checkpoint is ORIGINAL_CHECKPOINT


def test_a_module_loaded_before_the_block_that_takes_the_function_in_it_counts_nothing_after(monkeypatch):
    """Leaving the block restores what it replaced and what modules imported in it took, not every
    module's namespace again: one loaded before that took the instrumented function in the block keeps
    it, and outside a block it runs the original alone and counts nowhere."""
    early = types.ModuleType("early_stack")
    monkeypatch.setitem(sys.modules, "early_stack", early)
    with counted_checkpoints():
        early.checkpoint = torch.utils.checkpoint.checkpoint
    assert torch.utils.checkpoint.checkpoint is ORIGINAL_CHECKPOINT
    linear = nn.Linear(4, 4)
    hidden = torch.ones(2, 4, requires_grad=True)
    with counted_checkpoints() as units:
        pass
    early.checkpoint(linear, hidden, use_reentrant=False).sum().backward()
    assert units.calls(linear) == {}, "a block that ended counts no later call"
    assert torch.equal(hidden.grad, linear.weight.sum(0).expand(2, 4)), "the original checkpoint ran"
