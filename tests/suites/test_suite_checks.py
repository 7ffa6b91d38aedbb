"""The suites' own comparison helpers, in one process: option parsing, the bf16 tolerance, and the
rule that a comparison over nothing (no parameters, no state, no DTensor) fails instead of passing."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import suites.test_resume as resume_suite  # its test functions, called here (imported by name, pytest would collect them)
from suites.checkpoints.dcp_layout import TensorLayout, find_checkpoint, layouts_by_suffix
from suites.comparison.differences import state_differences, tensor_difference
from suites.recompute.grad_ckpt_findings import cache_presence_problems, no_cache_reason
from suites.recompute.grad_ckpt_precision import BF16_RTOL, EXACT, Precision, mismatch, precision_from
from suites.sharding.dtensor_optim_ranks import _compare as reshard_load_mismatches
from suites.sharding.dtensor_optim_ranks import continuation, layout_problems, param_shaped_states, settings_differ
from suites.state.module_state_walk import Entries, body_call_counters, module_state, module_state_problems
from suites.state.optimizer_state import quantized_state_kinds
from suites.test_resume import partial_restore
from suites.training_runs.restored_state import (
    optimizer_state_differences,
    param_group_differences,
    parameter_mismatches,
    state_mismatches,
)
from suites.training_runs.resumed_run import FinalState, RankRecord
from torchmatrix.testing import GradCkptOptions

from helpers.checkout import REPO


def test_grad_ckpt_precision_defaults_to_exact_float32_and_takes_bfloat16():
    assert precision_from(GradCkptOptions()) == EXACT and EXACT.exact
    bf16 = precision_from(GradCkptOptions(dtype="bfloat16"))
    assert bf16 == Precision("bfloat16") and not bf16.exact
    assert f"rtol={BF16_RTOL}" in bf16.describe()


def test_grad_ckpt_a_cache_only_one_run_returned_fails_and_none_in_both_is_no_problem():
    assert cache_presence_problems(0, 0) == []
    assert cache_presence_problems(3, 3) == []
    assert "3 entries without checkpointing and none with it" in cache_presence_problems(3, 0)[0]
    assert "3 entries with checkpointing and none without it" in cache_presence_problems(0, 3)[0]
    assert "(past_key_values=None," in no_cache_reason((False, False))
    assert "(an empty past_key_values," in no_cache_reason((True, True))


def ulps_above(tensor: torch.Tensor, ulps: int) -> torch.Tensor:
    """`tensor` with its first element moved up by `ulps` representable values."""
    moved = tensor.clone()
    bits = moved.view(torch.int16 if tensor.dtype == torch.bfloat16 else torch.int32)
    bits[0] += ulps
    return moved


def test_bf16_tolerance_allows_two_ulps_but_not_a_wider_drift_while_float32_allows_none():
    expected = torch.tensor([1.5, -0.75, 1.0, 0.25], dtype=torch.bfloat16)
    bf16 = Precision("bfloat16")
    assert mismatch(ulps_above(expected, 2), expected, bf16) is None
    assert "1/4 elements differ, max 8 ULP, max |Δ| 6.250e-02, first at [0]" in mismatch(
        ulps_above(expected, 8), expected, bf16
    )
    exact = expected.float()
    assert "1/4 elements differ, max 1 ULP, max |Δ| 1.192e-07, first at [0]" in mismatch(
        ulps_above(exact, 1), exact, EXACT
    )


def test_resume_comparisons_over_nothing_fail():
    assert parameter_mismatches({}, {}) == ["  the model has no parameters on this rank: nothing to compare"]
    assert state_mismatches({}, {}) == [
        "  the optimizer holds no state after training on this rank: nothing to compare"
    ]
    assert param_group_differences([], []) == [
        "after load: the optimizer had no param groups at the checkpoint step: nothing to compare"
    ]
    assert state_mismatches({"w": {}}, {"w": {}}) == state_mismatches({}, {}), "empty state per param is no state"
    assert optimizer_state_differences({"w": {}}, {"w": {}}) == [
        "after load: the optimizer had no state at the checkpoint step: nothing to compare"
    ]
    weight = torch.ones(2)
    assert parameter_mismatches({"w": weight}, {}) == ["  w: missing after the resume"]
    assert parameter_mismatches({"w": weight}, {"w": weight.clone()}) == []


def rank_record(straight: FinalState | None = None, resumed: FinalState | None = None, **fields) -> RankRecord:
    """A record as the resume suite's rank function returns it: empty runs unless given, `fields` set."""
    empty = FinalState([], {}, {}, {})
    return RankRecord(
        straight=straight or empty,
        resumed=resumed or empty,
        after_load=fields.pop("after_load", {}),
        other_implementations={},
        quantized_at_save=[],
        rng_streams_used=[],
        rebuilt_equals_saved=False,
        **fields,
    )


def records(*own_parameter_problems: list[str]) -> list[RankRecord]:
    """Per-rank records for partial_restore: each rank's own parameter problems after the load."""
    return [
        rank_record(after_load={"parameter_shards": lines, "optimizer_state": []}) for lines in own_parameter_problems
    ]


def negative_zero() -> torch.Tensor:
    """[0.0, 1.0] come back as [-0.0, 1.0]: equal by torch.equal, not bit for bit."""
    return torch.tensor([-0.0, 1.0])


def other_nan_payload() -> torch.Tensor:
    """[nan, 1.0] with another NaN payload: never equal by torch.equal, yet the same bits are."""
    nan = torch.tensor([float("nan"), 1.0])
    nan.view(torch.int32)[0] += 1
    return nan


def test_tensor_difference_names_bits_that_torch_equal_cannot_see():
    zero = torch.tensor([0.0, 1.0])
    assert torch.equal(negative_zero(), zero), "the old comparison saw nothing here"
    assert (
        tensor_difference(negative_zero(), zero)
        == "1/2 elements differ in their bits only (-0.0 for 0.0, or another NaN payload), first at [0]"
    )
    assert tensor_difference(torch.tensor(-0.0), torch.tensor(0.0), "saved") == "is -0.0, saved 0.0"
    nan = torch.tensor([float("nan"), 1.0])
    assert tensor_difference(nan, nan.clone()) is None, "the same NaN is the same bits"
    assert tensor_difference(other_nan_payload(), nan).startswith("1/2 elements differ in their bits only")
    assert (
        tensor_difference(torch.tensor([0.0, 1.5]), zero, "saved")
        == "1/2 elements differ, max 4194304 ULP, max |Δ| 5.000e-01, first at [1]"
    )
    assert tensor_difference(torch.tensor([1.0, float("nan")]), zero).endswith("max |Δ| nan, first at [0]")
    assert tensor_difference(zero.half(), zero) == "is torch.float16, expected torch.float32"
    assert tensor_difference(zero.reshape(2, 1), zero, "saved") == "has shape (2, 1), saved (2,)"
    assert (
        tensor_difference(torch.tensor([0, 7]), torch.tensor([0, 5]))
        == "1/2 elements differ, max |Δ| 2.000e+00, first at [1]"
    )


def test_state_differences_name_each_path_that_differs():
    saved = {"state": {3: {"exp_avg": torch.zeros(2), "step": 3}}, "groups": [{"lr": 0.1}], "gone": 1}
    loaded = {"state": {3: {"exp_avg": torch.tensor([0.0, -0.0]), "step": 3.0}}, "groups": [{"lr": 0.1}], "new": 2}
    assert state_differences(loaded, saved, reference="saved") == [
        "gone: missing, saved 1",
        "new: is 2, saved nothing",
        "state[3].exp_avg: 1/2 elements differ in their bits only (-0.0 for 0.0, or another NaN payload), first at [1]",
        "state[3].step: is 3.0, saved 3",
    ]
    assert state_differences([1, 2], [1], "losses") == ["losses: has 2 items, expected 1"]


def test_dtensor_optim_reshard_load_fails_on_a_negative_zero_and_a_changed_nan():
    saved = {"optimizer.w.exp_avg": torch.tensor([0.0, 1.0]), "model.w": torch.tensor([float("nan"), 1.0])}
    loaded = {"optimizer.w.exp_avg": negative_zero(), "model.w": other_nan_payload()}
    assert reshard_load_mismatches(saved, loaded)["mismatches"] == [
        "model.w: 1/2 elements differ in their bits only (-0.0 for 0.0, or another NaN payload), first at [0]",
        "optimizer.w.exp_avg: 1/2 elements differ in their bits only (-0.0 for 0.0, or another NaN payload), first at [0]",
    ]
    assert reshard_load_mismatches(saved, {key: value.clone() for key, value in saved.items()})["mismatches"] == []


class CodesAndScales(torch.Tensor):
    """Stands in for torchao's OptimState8bit: a tensor subclass the suites read dequantized."""


def test_quantized_state_leaves_the_steps_after_a_reshard_uncompared_and_says_so():
    """Equal dequantized values do not pin the codes and scales a quantized state stores per shard: the
    steps after a reshard load are not compared, whatever they give, and the reason names the class."""
    weight = nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    optimizer.state[weight]["momentum_buffer"] = torch.zeros(2)
    assert quantized_state_kinds(optimizer) == []
    optimizer.state[weight]["exp_avg"] = torch.Tensor._make_subclass(CodesAndScales, torch.zeros(2))
    assert quantized_state_kinds(optimizer) == ["CodesAndScales"]
    saved = {"optimizer.w.exp_avg": torch.zeros(2)}
    src, dst = "1", "2"
    differing_end = {"optimizer.w.exp_avg": torch.ones(2)}
    plain = continuation(saved, dict(saved), dict(saved), differing_end, src, dst, [])
    assert plain["continued_compared"] and plain["continued_mismatches"], (
        "plain state: the steps after the load are compared"
    )
    quantized = continuation(saved, dict(saved), dict(saved), differing_end, src, dst, ["CodesAndScales"])
    assert quantized["continued_mismatches"] == [] and not quantized["continued_compared"]
    assert quantized["continued"].startswith("not compared: the optimizer keeps its state as CodesAndScales")


def test_param_group_settings_that_differ_after_a_reshard_leave_the_steps_after_it_uncompared():
    """A scheduler the checkpointer built and loaded may leave another lr than the never-stopped run
    has: only the settings both hold are compared, and a difference is named in the reason."""
    loaded, straight = [{"lr": 0.5, "initial_lr": 1.0, "betas": (0.9, 0.95)}], [{"lr": 1.0, "betas": (0.9, 0.95)}]
    assert settings_differ([{"lr": 1.0, "initial_lr": 1.0}], straight) is None
    differ = settings_differ(loaded, straight)
    assert differ == ({"betas": (0.9, 0.95), "lr": 0.5}, {"betas": (0.9, 0.95), "lr": 1.0})
    saved = {"optimizer.w.exp_avg": torch.zeros(2)}
    result = continuation(saved, dict(saved), dict(saved), {"optimizer.w.exp_avg": torch.ones(2)}, "1", "2", [], differ)
    assert not result["continued_compared"] and result["continued_mismatches"] == []
    assert "'lr': 0.5" in result["continued"] and result["continued"].startswith(
        "not compared: the optimizer's param-group"
    )


def test_resume_fails_on_a_state_that_came_back_with_a_negative_zero():
    """The known-bad variant the old final check (torch.equal) passed: state and parameters resumed
    equal as numbers, but a 0.0 came back as -0.0."""
    cell = SimpleNamespace(id="ws1-none-sdpa-adamw")
    straight = FinalState([], {"w": torch.tensor([0.0, 1.0])}, {"w": {"exp_avg": torch.tensor([0.0, 1.0])}}, {})
    resumed = FinalState([], {"w": negative_zero()}, {"w": {"exp_avg": negative_zero()}}, {})
    experiment = [rank_record(straight, resumed)]
    recorded = []
    record_property = lambda name, value: recorded.append((name, value))  # noqa: E731 - pytest's fixture, as a stand-in
    with pytest.raises(AssertionError, match=r"w\.exp_avg: 1/2 elements differ in their bits only"):
        resume_suite.test_final_optimizer_state_identical(cell, experiment, record_property)
    with pytest.raises(AssertionError, match=r"w: 1/2 elements differ in their bits only"):
        resume_suite.test_final_parameters_identical(cell, experiment, record_property)
    resume_suite.test_final_parameters_identical(cell, [rank_record(straight, straight)], record_property)
    resume_suite.test_final_optimizer_state_identical(cell, [rank_record(straight, straight)], record_property)
    assert recorded == []  # every piece came back right after the load: no failure here is a consequence


def test_a_final_difference_after_a_piece_the_load_left_behind_names_that_piece():
    cell = SimpleNamespace(id="ws1-none-sdpa-adamw")
    straight = FinalState([], {"w": torch.tensor([1.0])}, {}, {})
    resumed = FinalState([], {"w": torch.tensor([2.0])}, {}, {})
    left_behind = rank_record(straight, resumed, after_load={"scheduler": ["last_epoch is 0, saved 4"], "rng": []})
    recorded = []
    with pytest.raises(AssertionError, match="final parameters"):
        resume_suite.test_final_parameters_identical(
            cell, [left_behind], lambda name, value: recorded.append((name, value))
        )
    assert recorded == [("consequence_of", "test_state_restored_right_after_load[piece=scheduler]")]


def test_resume_names_the_ranks_that_kept_their_state_when_only_some_did():
    lost = ["after load: parameter shard w differs"]
    assert partial_restore("parameters", records([], lost)) == [
        "after load: parameters restored on rank 0 only: ranks [1] differ in their own shards"
    ]
    assert partial_restore("parameters", records([], lost, [], lost)) == [
        "after load: parameters restored on ranks [0, 2] only: ranks [1, 3] differ in their own shards"
    ]
    assert partial_restore("parameters", records(lost, lost)) == []
    assert partial_restore("parameters", records([], [])) == []
    assert partial_restore("optimizer_state", records([], lost)) == []
    assert partial_restore("scheduler", records([], lost)) == []


def test_dtensor_layout_check_fails_when_no_param_is_a_dtensor_where_fsdp2_should_make_them():
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    assert layout_problems(model, optimizer, dtensors_expected=True) == [
        "no parameter of Linear is a DTensor after `parallelize` under FSDP2: there is no state layout to check"
    ]
    assert layout_problems(model, optimizer, dtensors_expected=False) == []


STATE_KEYED_BY_LOCAL_SHARD = """
import json, torch, torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from suites.sharding.dtensor_optim_ranks import layout_problems

dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
mesh = init_device_mesh("cpu", (1,))
model = nn.Linear(4, 4, bias=False)
model.weight = nn.Parameter(distribute_tensor(model.weight.detach(), mesh, [Shard(0)]))
optimizer = torch.optim.AdamW([model.weight])
optimizer.state[model.weight.to_local()] = {"exp_avg": torch.zeros(4, 4)}
print(json.dumps(layout_problems(model, optimizer, dtensors_expected=True)))
"""


def test_dtensor_layout_check_fails_when_the_state_is_kept_under_something_other_than_the_params():
    """State keyed by each param's local shard is no state of the DTensor param: the check must say
    so, not pass having found no DTensor key to compare."""
    done = subprocess.run([sys.executable, "-c", STATE_KEYED_BY_LOCAL_SHARD], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [
        "weight: no optimizer state after a step, while other params have some"
    ]


def test_dtensor_optim_counts_param_shaped_state_and_a_stateless_optimizer_has_none():
    model = nn.Linear(3, 2)
    for optimizer, held in (
        (torch.optim.SGD(model.parameters(), lr=0.1), 0),
        (torch.optim.AdamW(model.parameters()), 4),
    ):
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        assert param_shaped_states(optimizer) == held, type(optimizer).__name__


def layout(key: str) -> TensorLayout:
    return TensorLayout(key=key, size=(2,), dtype=torch.float32, chunks=())


def test_dcp_layout_finds_each_state_under_any_prefix_and_gives_a_key_to_its_longest_suffix():
    layouts = {key: layout(key) for key in ("optimizer.state.weight.exp_avg", "optimizer.state.head.weight.exp_avg")}
    found = layouts_by_suffix(layouts, ["weight.exp_avg", "head.weight.exp_avg", "bias.exp_avg"])
    assert [entry.key for entry in found["weight.exp_avg"]] == ["optimizer.state.weight.exp_avg"]
    assert [entry.key for entry in found["head.weight.exp_avg"]] == ["optimizer.state.head.weight.exp_avg"]
    assert found["bias.exp_avg"] == []


def test_dcp_layout_finds_the_one_checkpoint_a_checkpointer_wrote_under_its_directory(tmp_path):
    assert find_checkpoint(tmp_path) is None
    (tmp_path / "step-1").mkdir()
    (tmp_path / "step-1" / ".metadata").write_bytes(b"")
    assert find_checkpoint(tmp_path) == tmp_path / "step-1"
    (tmp_path / "step-2").mkdir()
    (tmp_path / "step-2" / ".metadata").write_bytes(b"")
    assert find_checkpoint(tmp_path) is None


class AuxLossLayer(nn.Module):
    """A module with plain attribute state next to a parameter, a buffer and a submodule, and a body
    counter that `body_calls()` reports under another name than the reference's."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(2, 2)
        self.register_buffer("seen", torch.zeros(()))
        self.aux_losses = [torch.ones(())]
        self.routing = {"expert": 3}
        self.calls = 5
        self.name = "layer"
        self.debug_log = ["ignored"]


class CountingStack(nn.Sequential):
    def body_calls(self) -> dict[str, int]:
        return {"0": self[0].calls}


def test_grad_ckpt_module_state_holds_plain_attributes_and_leaves_out_parameters_and_buffers():
    state, ints = module_state(CountingStack(AuxLossLayer()), ignored=("debug_log",))
    assert {path for path in state if path.startswith("0.") and not path.startswith("0.proj.")} == {
        "0.aux_losses",
        "0.aux_losses[0]",
        "0.routing",
        "0.routing['expert']",
        "0.calls",
        "0.name",
    }
    assert repr(state["0.aux_losses"]) == "1 entries" and state["0.routing['expert']"] == 3
    assert {"0.calls", "0.routing['expert']"} <= set(ints)


def test_grad_ckpt_finds_the_counters_body_calls_reports_whatever_their_name_and_puts_them_back():
    model = CountingStack(AuxLossLayer())
    _, ints = module_state(model)
    assert body_call_counters(model, ints) == {"0.calls"}
    assert model[0].calls == 5 and model[0].routing == {"expert": 3}


def test_grad_ckpt_module_state_problems_name_the_path_and_skip_what_was_set_up_differently():
    before = ({"0.checkpointing": True, "0.count": 0}, {"0.checkpointing": False, "0.count": 0})
    after_with = {"0.checkpointing": True, "0.count": 2, "0.aux": Entries(12)}
    after_without = {"0.checkpointing": False, "0.count": 1, "0.aux": Entries(6)}
    assert module_state_problems(after_with, after_without, before) == ["0.aux: 12 entries vs 6", "0.count: 2 vs 1"]
    assert module_state_problems(after_with, after_without, before, {"0.count"}) == ["0.aux: 12 entries vs 6"]
