"""Known limits of the CPU simulation: torch's own messages are recognised, on CPU only, from their
start only, and the docs render every limit from the module."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torchmatrix.ranks.simulation_limits import LIMITS, as_simulation_limit, limit_of
from torchmatrix.status import Status

from helpers.checkout import checkout_env

PREMUL_SUM, FLEX, CUDA, NCCL = (limit.name for limit in LIMITS)


def failed(message: str, status: str = "failed") -> dict:
    return {"status": status, "message": message, "text": f"Traceback ...\n{message}\n", "duration": 1.0}


@pytest.mark.parametrize(
    ("root_cause", "limit"),
    [
        ("RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo", PREMUL_SUM),
        (
            "NotImplementedError: FlexAttention does not support backward on CPU. Please set the input "
            "requires_grad to False or use another device.",
            FLEX,
        ),
        ("AssertionError: Torch not compiled with CUDA enabled", CUDA),
        (
            "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
            "installed a driver from http://www.nvidia.com/Download/index.aspx",
            CUDA,
        ),  # a CUDA build on a machine without a driver (c10/cuda/CUDAFunctions.cpp)
        ("RuntimeError: No CUDA GPUs are available", CUDA),
        ("AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'", CUDA),
        ("RuntimeError: Distributed package doesn't have NCCL built in", NCCL),
        (
            "ValueError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!",
            NCCL,
        ),  # a CUDA build without GPUs (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp)
        ("torch.distributed.DistBackendError: Cannot use ReduceOp.PREMUL_SUM with Gloo", PREMUL_SUM),
    ],
)
def test_each_known_message_names_its_limit(root_cause, limit):
    assert limit_of(root_cause).name == limit


@pytest.mark.parametrize(
    "root_cause",
    [
        "AssertionError: gradient of layer0.w differs",
        "RuntimeError: Cannot use ReduceOp.AVG with Gloo",
        "AssertionError: expected 'Cannot use ReduceOp.PREMUL_SUM with Gloo' to be raised",  # not the message's start
        "Torch not compiled with CUDA enabled",  # no exception type: not a root cause line
        "rank 1 died with signal SIGKILL",
        "",
    ],
)
def test_other_failures_are_not_limits(root_cause):
    assert limit_of(root_cause) is None


def test_a_known_failure_on_cpu_becomes_a_limit_with_its_hint_and_keeps_its_text():
    result = failed("RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo")
    limited = as_simulation_limit(result, "cpu")
    assert limited["status"] == Status.SIMULATION_LIMIT
    assert limited["message"] == (
        "CPU-simulation limit: RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo; hint: call "
        "set_force_sum_reduction_for_comms(True) on the fully_shard modules in CPU cells, or drop the divide factor"
    )
    assert limited["text"] == result["text"] and limited["duration"] == 1.0
    errored = as_simulation_limit(failed("AssertionError: Torch not compiled with CUDA enabled", "error"), "cpu")
    assert errored["status"] == Status.SIMULATION_LIMIT, "a fixture that asks for cuda errors in setup"


def test_on_a_gpu_the_same_text_stays_a_failure():
    result = failed("RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo")
    assert as_simulation_limit(result, "cuda") == result
    assert as_simulation_limit(result, "") == result, "an unknown device is not the CPU simulation"


def test_only_failures_are_relabelled():
    passed = {"status": "passed", "message": "", "text": ""}
    skipped = {"status": "skipped", "message": "RuntimeError: No CUDA GPUs are available", "text": ""}
    assert as_simulation_limit(passed, "cpu") == passed
    assert as_simulation_limit(skipped, "cpu") == skipped


REPRODUCE = """
import json, os, tempfile

import torch
import torch.distributed as dist

from torchmatrix.messages.root_cause import root_cause

seen = {}


def attempt(name, fn):
    try:
        fn()
    except Exception as error:
        seen[name] = root_cause(error)
    else:
        seen[name] = "no error"


def premul_sum():
    dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(0.5))


def flex_backward():
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = (torch.randn(1, 1, 16, 8, requires_grad=True) for _ in range(3))
    flex_attention(q, k, v).sum().backward()


store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
attempt("premul_sum", premul_sum)
attempt("flex_backward", flex_backward)
attempt("to_cuda", lambda: torch.zeros(1).to("cuda"))
attempt("set_device", lambda: torch.cuda.set_device(0))
attempt("nccl", lambda: dist.new_group(backend="nccl"))
dist.destroy_process_group()
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_torch_raises_exactly_the_messages_recognised():
    """The CPU build of torch reproduces every limit it can (the others need a CUDA build without GPUs)."""
    done = subprocess.run(
        [sys.executable, "-c", REPRODUCE], env=checkout_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    names = {case: getattr(limit_of(line), "name", line) for case, line in seen.items()}
    assert names == {
        "premul_sum": PREMUL_SUM,
        "flex_backward": FLEX,
        "to_cuda": CUDA,
        "set_device": CUDA,
        "nccl": NCCL,
    }, seen
