"""The probed environment as one typed record: what plan.json and a group plan hold of it, read back."""

from __future__ import annotations

import pytest

from torchmatrix.env.devices import Environment

CPU = Environment("2.13.0+cpu", "abc", None, 0, "")
GPUS = Environment("2.13.0+cu130", "abc", "13.0", 8, "NVIDIA H100")


def test_plan_json_keeps_the_keys_it_had_when_the_environment_was_a_dict():
    assert CPU.running("/venv/bin/python").to_json() == {
        "torch": "2.13.0+cpu",
        "git_version": "abc",
        "cuda_version": None,
        "gpu_count": 0,
        "gpu_name": "",
        "device": "cpu (ranks simulated as processes, gloo)",
        "device_type": "cpu",
        "backend": "gloo",
        "python": "/venv/bin/python",
    }
    assert "python" not in CPU.to_json(), "a torch that cannot run the cells names no interpreter"
    assert Environment.without_torch("none (torch did not install)").to_json() == {
        "device": "none (torch did not install)"
    }


@pytest.mark.parametrize(
    "environment",
    [CPU, CPU.running("/venv/bin/python"), GPUS.running("/venv/bin/python"), Environment.without_torch("none (x)")],
    ids=["cpu", "cpu-running", "gpus", "no-torch"],
)
def test_an_environment_reads_back_as_written(environment):
    assert Environment.from_json(environment.to_json()) == environment


def test_the_device_follows_the_gpus_and_an_environment_without_torch_has_none():
    assert (GPUS.device_type, GPUS.backend, GPUS.gpu_count) == ("cuda", "cpu:gloo,cuda:nccl", 8)
    assert GPUS.description == "cuda (8x NVIDIA H100, CUDA 13.0)"
    missing = Environment.without_torch("none (torch is not importable)")
    assert (missing.device_type, missing.gpu_count, missing.description) == ("", 0, "none (torch is not importable)")


@pytest.mark.parametrize(
    ("recorded", "read"),
    [
        ({}, Environment.without_torch("unknown")),
        ({"python": "/elsewhere/python"}, Environment.without_torch("unknown")),
        ({"torch": ["2.13.0"], "device": "gpu"}, Environment.without_torch("gpu")),
        (
            {"torch": "2.13.0+cpu", "gpu_count": "8", "git_version": 5, "cuda_version": 13, "python": None},
            Environment("2.13.0+cpu", "", None, 0, ""),
        ),
        ({"torch": "2.13.0+cpu", "gpu_count": True}, Environment("2.13.0+cpu", "", None, 0, "")),
    ],
    ids=["empty", "no-torch-build", "torch-not-text", "wrong-kinds", "bool-is-no-count"],
)
def test_a_plan_from_another_machine_with_values_of_the_wrong_kind_reads_them_as_absent(recorded, read):
    assert Environment.from_json(recorded) == read
