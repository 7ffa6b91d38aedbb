"""grad_ckpt's two compiled steps draw from one random stream on CUDA: torch.compile's graph-safe RNG,
which gives checkpointed regions random numbers of their own there, is off while they run and back after."""

from __future__ import annotations

import pytest
import torch
import torch._functorch.config as functorch_config

from torchmatrix.suites.recompute.compiled_rng import GRAPH_SAFE_RNG_OFF, graph_safe_rng_applies, one_random_stream
from torchmatrix.suites.recompute.grad_ckpt_precision import EXACT, Precision

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def test_off_while_compiled_steps_run_on_cuda_and_back_afterwards():
    before = functorch_config.graphsafe_rng_functionalization
    with one_random_stream(CUDA, compiled=True):
        assert functorch_config.graphsafe_rng_functionalization is False
    assert functorch_config.graphsafe_rng_functionalization == before


@pytest.mark.parametrize(("device", "compiled"), [(CPU, True), (CUDA, False)])
def test_untouched_where_it_does_not_apply(device, compiled):
    before = functorch_config.graphsafe_rng_functionalization
    assert not graph_safe_rng_applies(device, compiled)
    with one_random_stream(device, compiled):
        assert functorch_config.graphsafe_rng_functionalization == before


def test_the_failure_message_says_both_steps_ran_without_it():
    assert GRAPH_SAFE_RNG_OFF in Precision("float32", graph_safe_rng_off=True).describe()
    assert "graph-safe" not in EXACT.describe()
