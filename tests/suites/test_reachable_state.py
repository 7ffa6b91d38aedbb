"""What grad_ckpt's module-state walk reaches beyond plain attributes (suites/state/reachable_state.py):
objects of the user's classes on a layer, and module-level registries of the modules that define the
model's classes, put back after each run; cycles end, and `ignored_attributes` still leaves a name out."""

from __future__ import annotations

import torch
from torch import nn

from suites.state.module_state_walk import module_state
from suites.state.reachable_state import is_user_object, kept_as_they_are, module_level_containers
from torchmatrix.models.mutants import grad_ckpt
from torchmatrix.models.mutants.grad_ckpt import AUX_LOSS_TRACKER, RoutingStats, aux_loss_list_model

CELL = {"attn": "sdpa", "fsdp": "none", "world_size": 1}


class Node:
    """A plain object that points at itself."""

    def __init__(self):
        self.count = 1
        self.me = self


def test_user_objects_are_walked_and_torch_or_stdlib_objects_are_not():
    assert is_user_object(RoutingStats()) and is_user_object(Node())
    assert not is_user_object(torch.Generator()) and not is_user_object(nn.Linear(1, 1))
    layer = nn.Linear(1, 1)
    layer.node = Node()
    state, _ = module_state(nn.Sequential(layer))
    assert state["0.node.count"] == 1 and not any(path.startswith("0.node.me.") for path in state)


def test_a_registry_at_module_level_is_found_and_put_back_as_it_was():
    model = aux_loss_list_model(CELL)
    found = module_level_containers(model)
    assert found["torchmatrix.models.mutants.grad_ckpt.AUX_LOSS_TRACKER"] is AUX_LOSS_TRACKER
    put_back = kept_as_they_are(found)
    AUX_LOSS_TRACKER["prefix layer 0"] = [torch.ones(())]
    put_back()
    assert AUX_LOSS_TRACKER == {} and grad_ckpt.AUX_LOSS_TRACKER is AUX_LOSS_TRACKER


def test_ignored_attributes_leave_out_an_object_and_a_registry_by_name():
    model = aux_loss_list_model(CELL)
    walked, _ = module_state(model)
    assert "prefix_layers.0.routing_stats.tokens_routed" in walked
    assert "torchmatrix.models.mutants.grad_ckpt.AUX_LOSS_TRACKER" in walked
    ignored, _ = module_state(model, ("routing_stats", "AUX_LOSS_TRACKER"))
    assert not any("routing_stats" in path or "AUX_LOSS_TRACKER" in path for path in ignored)


def test_a_registry_is_found_through_a_class_a_wrapper_made_from_the_models():
    """FSDP2 swaps each module's class for a subclass defined in torch: the bases still say where the registry lives."""
    model = aux_loss_list_model(CELL)
    kind = type(model.prefix_layers[0])
    for layer in model.prefix_layers:
        layer.__class__ = type(f"FSDP{kind.__name__}", (kind,), {"__module__": "torch.distributed.fsdp"})
    assert all(type(module).__module__ != grad_ckpt.__name__ for module in model.modules())
    assert "torchmatrix.models.mutants.grad_ckpt.AUX_LOSS_TRACKER" in module_level_containers(model)


class Instantiating(dict):
    """transformers' ACT2FN: a lookup builds an instance of the class stored under the key."""

    def __getitem__(self, key):
        return super().__getitem__(key)()


FACTORIES = Instantiating(silu=nn.SiLU)
KERNELS = {"silu": nn.SiLU}


class UsesFactories(nn.Module):
    """A module whose Python module keeps a factory dict and a plain dict at module level."""

    def __init__(self):
        super().__init__()
        self.act = FACTORIES["silu"]


def test_a_dict_that_computes_its_items_is_no_state_and_stays_as_it_is():
    found = module_level_containers(UsesFactories())
    assert f"{__name__}.KERNELS" in found and f"{__name__}.FACTORIES" not in found
    kept_as_they_are(found)()
    assert dict.__getitem__(FACTORIES, "silu") is nn.SiLU and KERNELS == {"silu": nn.SiLU}
