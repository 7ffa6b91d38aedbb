"""The default state adapter (suites/state/optimizer_state.py): quantized state compares by its values,
and the suites can tell quantized state from plain floats."""

from __future__ import annotations

import pytest
import torch

from torchmatrix.suites.comparison.differences import state_differences
from torchmatrix.suites.state.optimizer_state import (
    ParamName,
    optimizer_attributes,
    plain_state,
    quantized_keys,
    state_adapter,
)


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


def hybrid_optimizer(model: torch.nn.Module, updates: int = 0) -> torch.optim.Optimizer:
    """AdamW with a hybrid optimizer's tables on itself: which params it routes as matrices, and a per-param update count."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    optimizer.matrix_params = {param: param.dim() >= 2 for param in model.parameters()}
    optimizer.updates_per_param = dict.fromkeys(model.parameters(), updates)
    return optimizer


def attributes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    return optimizer_attributes(optimizer, {id(param): name for name, param in model.named_parameters()})


def test_tables_keyed_by_params_compare_by_name_and_differences_name_the_param_not_its_values():
    """Two builds hold other param objects: the routing table a fresh build reproduces is equal;
    a count the load lost is named per param, in a few words."""
    saved_model, loaded_model = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)
    saved = attributes(saved_model, hybrid_optimizer(saved_model, updates=3))
    loaded = attributes(loaded_model, hybrid_optimizer(loaded_model))
    assert saved["matrix_params"] == {ParamName("weight"): True, ParamName("bias"): False}
    assert state_differences(loaded["matrix_params"], saved["matrix_params"], "matrix_params", "saved") == []
    assert state_differences(loaded, saved, reference="saved") == [
        "updates_per_param[<param bias>]: is 0, saved 3",
        "updates_per_param[<param weight>]: is 0, saved 3",
    ]


def test_a_differing_tensor_is_told_by_shape_and_dtype_and_a_tensor_key_of_no_param_is_left_out():
    assert state_differences({"ema": torch.ones(64, 64)}, {"ema": torch.zeros(64, 64)}, reference="saved") == [
        "ema: 4096/4096 elements differ, max 1065353216 ULP, max |Δ| 1.000e+00, first at [0, 0]"
    ]
    assert state_differences({"ema": torch.zeros(64)}, {"ema": torch.zeros(64, 64)}, reference="saved") == [
        "ema: has shape (64,), saved (64, 64)"
    ]
    assert state_differences({}, {"ema": torch.zeros(64, 64)}, reference="saved") == [
        "ema: missing, saved a [64, 64] float32 tensor"
    ]
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    optimizer.by_tensor = {torch.zeros(1): 1}
    assert "by_tensor" not in optimizer_attributes(optimizer, {})
