"""Names read through wrappers by module identity (suites/state/built_names.py): a trainer's wrapper the
suites do not know, checkpoint wrappers and torch.compile all read as the model was built."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from suites.state.built_names import (
    module_names,
    name_as_built,
    named_buffers_as_built,
    named_modules_as_built,
    named_parameters_as_built,
    remember_built,
)
from torchmatrix.models.trainer_held import TrainerModule, UserModule


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
        self.register_buffer("scale", torch.ones(1))


def wrapped_stack() -> tuple[nn.Module, list[str]]:
    """A user module around a decoder, its second layer checkpoint-wrapped and compiled, the whole held by a trainer."""
    user = UserModule(Decoder())
    built = module_names(user)
    expected = [name for name, _ in user.named_parameters()]
    user.model.layers[1] = torch.compile(checkpoint_wrapper(user.model.layers[1]))
    return remember_built(TrainerModule(user), built), expected


def test_parameters_buffers_and_modules_read_as_built():
    held, expected = wrapped_stack()
    assert [name for name, _ in held.named_parameters()][2].startswith("_forward_module.model.layers.1._orig_mod.")
    assert [name for name, _ in named_parameters_as_built(held)] == expected
    assert [name for name, _ in named_buffers_as_built(held)] == ["model.scale"]
    names = dict((id(module), name) for name, module in named_modules_as_built(held))
    assert names[id(held.model.layers[1]._orig_mod._checkpoint_wrapped_module)] == "model.layers.1"
    assert names[id(held)] == ""


def test_a_model_the_suites_never_saw_built_keeps_its_names_without_wrapper_prefixes():
    plain = nn.Sequential(checkpoint_wrapper(nn.Linear(2, 2)))
    assert name_as_built(plain, "0._checkpoint_wrapped_module.weight") == "0.weight"
