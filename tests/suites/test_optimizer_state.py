"""The default state adapter (suites/optimizer_state.py): quantized state compares by its values,
and the suites can tell quantized state from plain floats."""

from __future__ import annotations

import pytest
import torch

from torchmatrix.suites.optimizer_state import plain_state, quantized_keys, state_adapter


def test_a_tensor_subclass_is_dequantized_and_plain_values_pass_through():
    subclass_8bit = pytest.importorskip("torchao.optim.subclass_8bit")
    values = torch.linspace(-1, 1, 4096)
    quantized = subclass_8bit.OptimState8bit.zeros((4096,), signed=True)
    quantized.copy_(values)
    plain = plain_state({"step": torch.tensor(3.0), "exp_avg": quantized, "lr": 0.1})
    assert type(plain["exp_avg"]) is torch.Tensor and plain["exp_avg"].dtype == torch.float32
    assert (plain["exp_avg"] - values).abs().max() < 0.01, "dequantized values stand for what was stored"
    assert not torch.equal(plain["exp_avg"], torch.zeros(4096))
    assert plain["step"].item() == 3.0 and plain["lr"] == 0.1


def test_quantized_keys_are_subclasses_and_integer_codes_not_floats_or_scalars():
    subclass_8bit = pytest.importorskip("torchao.optim.subclass_8bit")
    state = {
        "step": torch.tensor(3),
        "exp_avg": subclass_8bit.OptimState8bit.zeros((4096,), signed=True),
        "state1": torch.zeros(4096, dtype=torch.uint8),
        "kahan_comp": torch.zeros(1, dtype=torch.uint8),
        "exp_avg_sq": torch.zeros(4096),
    }
    assert quantized_keys(state) == ["exp_avg", "state1"]


def test_a_components_entry_overrides_the_default_adapter():
    assert state_adapter({}, "adamw") is plain_state
    custom = {"plain_state_bnb_adamw8bit": "torchmatrix.models.third_party_optim:bnb_plain_state"}
    assert state_adapter(custom, "bnb_adamw8bit").__name__ == "bnb_plain_state"
