"""The asynchronous form of the checkpointer's save (suites/checkpoints/checkpointer_forms.py: SaveInFlight), the
naming of a loaded tensor by the step it holds (suites/checkpoints/held_steps.py), and option `async_save`."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest
import torch

from torchmatrix.matrix.suite_options import CrossVersionOptions, OptionError, ResumeOptions
from torchmatrix.suites.checkpoints.checkpointer_forms import SaveInFlight
from torchmatrix.suites.checkpoints.held_steps import held_state, held_step_lines
from torchmatrix.testing import checkpointer_path, saves_asynchronously


def resolved(value=None) -> Future:
    future = Future()
    future.set_result(value)
    return future


def test_a_future_is_an_asynchronous_save_whose_mapping_result_is_its_extra_state():
    pending = Future()
    save = SaveInFlight(pending, "mine")
    assert save.is_asynchronous and save.uploading()
    pending.set_result({"tokens_seen": 96})
    assert not save.uploading() and save.result() == {"tokens_seen": 96}
    assert SaveInFlight(resolved(SimpleNamespace(planner_data=None)), "mine").result() == {}  # DCP's metadata


def test_a_staged_save_waits_for_its_staging_and_a_synchronous_one_returns_at_once():
    staging, upload = Future(), resolved()
    save = SaveInFlight(SimpleNamespace(staging_completion=staging, upload_completion=upload), "mine")
    assert save.is_asynchronous and save.staging is staging
    staging.set_result(None)
    save.wait_for_staging()
    assert save.result() == {}
    synchronous = SaveInFlight({"tokens_seen": 3}, "mine")
    assert not synchronous.is_asynchronous and not synchronous.uploading()
    assert synchronous.result() == {"tokens_seen": 3}


def history() -> dict[int, dict]:
    """Steps 1-3 of one parameter and its moments and step count."""
    return {
        step: held_state(
            {"w": torch.full((2,), float(step))},
            {"w": {"step": torch.tensor(float(step)), "exp_avg": torch.full((2,), step / 10)}},
        )
        for step in (1, 2, 3)
    }


def test_a_loaded_tensor_is_named_by_the_step_it_holds_and_a_torn_checkpoint_says_so():
    steps = history()
    torn = {**steps[2], "optimizer state step of w": steps[3]["optimizer state step of w"]}
    lines = held_step_lines(steps, 2, torn)
    assert lines[0] == "the checkpoint is torn: step from step 3, while exp_avg, parameter from step 2, the save's"
    assert lines[1] == "after load: optimizer state step of w holds step 3's value, the save was at step 2"
    assert lines[2].startswith("step 3, taken after the save at step 2 returned, reached the checkpoint")
    stale = held_step_lines(steps, 2, steps[1])
    assert "after load: parameter w holds step 1's value, the save was at step 2" in stale
    assert stale[-1].startswith("the save at step 2 wrote the state of step 1, an earlier save's, again")
    assert held_step_lines(steps, 2, steps[2]) == []


def test_a_value_no_step_held_or_several_did_is_left_to_the_after_load_checks():
    steps = history()
    steps[3]["parameter w"] = steps[1]["parameter w"]  # two steps hold the same value: no single step to name
    loaded = {**steps[2], "parameter w": steps[1]["parameter w"], "optimizer state exp_avg of w": torch.zeros(2)}
    assert held_step_lines(steps, 2, loaded) == []


def test_option_async_save_names_cells_by_glob_and_picks_the_component():
    options = ResumeOptions.from_table({"async_save": ["ws2-fsdp2-*-foreach-*"]}, user=True)
    assert saves_asynchronously("ws2-fsdp2-flat-sdpa-adamw-foreach-none", options.async_save)
    assert not saves_asynchronously("ws2-fsdp2-flat-sdpa-adamw-default-none", options.async_save)
    components = {"checkpointer": "mine:Sync"}
    assert checkpointer_path(components, False) == "mine:Sync"
    assert checkpointer_path(components, True) == "torchmatrix.models.async_checkpoint:AsyncCheckpointer"
    assert checkpointer_path({**components, "checkpointer_async": "mine:Async"}, True) == "mine:Async"


def test_cross_version_refuses_async_save_in_one_line():
    with pytest.raises(OptionError, match=r"^async_save: cross_version saves synchronously; set async_save under"):
        CrossVersionOptions.from_table({"async_save": ["*"]}, user=True)
