"""The probed environment as one typed record: what plan.json and a group plan hold of it, read back,
and which torch release it has (its build's version, or the distribution pip installed)."""

from __future__ import annotations

import pytest

from torchmatrix.env.devices import Environment, probe

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
    "environment",
    [
        CPU,
        GPUS,
        Environment("2.13.0+cu130", "abc", "13.0", 2, "NVIDIA H100, rev. B, CUDA-capable"),
        Environment.without_torch("none (torch did not install)"),
        Environment(),
    ],
    ids=["cpu", "gpus", "name-with-commas", "no-torch", "not-recorded"],
)
def test_the_words_a_report_records_read_back_as_the_environment_that_wrote_them(environment):
    words = (environment.torch, environment.git_version, environment.cuda_version or "", environment.description)
    assert Environment.recorded(*words) == environment


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


def environment(torch: str, release: str) -> Environment:
    return Environment(torch=torch, git_version="", cuda_version=None, gpu_count=0, gpu_name="", release=release)


def test_a_release_is_the_builds_version_or_the_installed_distributions():
    assert environment("2.13.0+cpu", "2.13.0+cpu").has_release("2.13.0")
    assert environment("2.13.0+cpu", "2.95.0").has_release("2.95.0")  # a wheel whose build reports another number
    assert not environment("2.13.0+cpu", "2.13.0+cpu").has_release("2.14.1")
    assert not environment("2.13.0+cpu", "").has_release("")  # a torch pip did not install names no release


def test_the_probe_reports_the_distribution_pip_installed():
    from importlib import metadata

    found = probe()
    assert found.release == metadata.version("torch") and found.has_release(found.base_version)
