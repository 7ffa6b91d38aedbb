"""The grad-ckpt suite's reading of a model as it is, in one process: the cache as any pytree found on
the output or through the cache hook, and the compute dtype a model or matrix.toml declares."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from suites.components.forward_output import OUTPUT
from suites.recompute.checkpoint_units import CheckpointUnits
from suites.recompute.grad_ckpt_precision import BF16_RTOL, precision_from
from suites.recompute.grad_ckpt_steps import found_caches
from suites.state.cache_tree import cache_contents, cache_marks
from torchmatrix.matrix.suite_options import OptionError
from torchmatrix.testing import GradCkptOptions


@dataclass
class Layer:
    keys: torch.Tensor
    values: torch.Tensor


class ObjectCache:
    """Shaped like transformers' DynamicCache: a list of layer objects and a counter."""

    def __init__(self) -> None:
        self.layers = [Layer(torch.zeros(1), torch.ones(1))]
        self.seen_tokens = 3


def test_any_pytree_is_flattened_to_tensors_and_plain_state_by_path():
    tensors, state = cache_contents({"past_key_values": ObjectCache(), "cache": {0: {"key_states": torch.zeros(2)}}})
    assert sorted(tensors) == [
        "cache[0]['key_states']",
        "past_key_values.layers[0].keys",
        "past_key_values.layers[0].values",
    ]
    assert state["past_key_values.seen_tokens"] == 3 and state["len(past_key_values.layers)"] == 1


def test_the_cache_on_the_output_comes_first_then_the_hook():
    units = CheckpointUnits(containers=[("cache", {0: {"key_states": torch.zeros(1)}}, {})])  # empty when handed over
    output_cache = ObjectCache()
    assert found_caches({OUTPUT: {"loss": torch.zeros(()), "past_key_values": output_cache}}, units) == (
        {"past_key_values": output_cache},
        "output",
    )
    caches, source = found_caches({OUTPUT: torch.zeros(())}, units)
    assert source == "hook" and list(caches) == ["cache"]


def test_no_cache_anywhere_is_an_empty_one_and_containers_forward_did_not_write_are_not_caches():
    """A block mask or rotary table handed to every layer holds tensors, but forward never writes them."""
    mask = {"mask": torch.ones(2, 2)}
    units = CheckpointUnits(
        containers=[("options", {"causal": True}, {}), ("masks", mask, cache_marks({"masks": mask}))]
    )
    assert found_caches({OUTPUT: (torch.zeros(()), "logits")}, units) == ({}, "output")
    mask["mask"].add_(1)
    assert found_caches({OUTPUT: (torch.zeros(()), "logits")}, units)[1] == "hook", "written in place: a cache"


def test_a_declared_compute_dtype_compares_and_labels_at_its_precision():
    declared = precision_from(GradCkptOptions()).computing("bfloat16")
    assert not declared.exact
    assert declared.describe().startswith(f"float32 params, bfloat16 compute, rtol={BF16_RTOL}")
    assert precision_from(GradCkptOptions(compute_dtype="bfloat16")) == declared
    assert precision_from(GradCkptOptions(compute_dtype="float32")).computing("bfloat16").exact, "the option wins"
    assert precision_from(GradCkptOptions()).computing("float32").describe() == "float32, bit for bit"


def test_a_compute_dtype_without_a_derived_tolerance_is_refused():
    with pytest.raises(OptionError, match="compute_dtype: 'float16'; write one of 'float32', 'bfloat16'"):
        GradCkptOptions(compute_dtype="float16")
    with pytest.raises(ValueError, match="the model declares compute_dtype = torch.float16"):
        precision_from(GradCkptOptions()).computing("float16")
