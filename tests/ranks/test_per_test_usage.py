"""Per test, the CPU seconds its ranks and pytest used and every warning raised on a rank or in
pytest: recorded by the plugin as JUnit properties, read back into results.json, and diffed between
versions (a warning on one version only is new there, or gone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from torchmatrix.ranks.per_test_usage import cpu_seconds_of, module_of, normalised, process_cpu_seconds
from torchmatrix.reports.records import TestRecord
from torchmatrix.reports.warning_changes import new_and_gone

from helpers.matrix_files import matrix_toml
from helpers.projects import Project

SUITE = """
import os
import time
import warnings

import torch.distributed as dist


def _warn_on_every_rank(times):
    for _ in range(times):
        warnings.warn(f"old_api at 0x7f00deadbeef is deprecating ShardedTensor, rank {dist.get_rank()}", FutureWarning)
    return 0


def _spin():
    until = time.process_time() + 0.4  # CPU seconds, not iterations: a fast machine counts faster
    while time.process_time() < until:
        pass
    return 0


def test_warns(cell, ranks):
    ranks.run(_warn_on_every_rank, 3)
    warnings.warn("in the pytest process, see line 12", UserWarning)


def _spin_then_fail():
    _spin()
    raise RuntimeError("the rank failed after its work")


def _spin_then_exit_on_rank_1():
    _spin()
    if dist.get_rank() == 1:
        os._exit(1)
    return 0


def test_burns_cpu(cell, ranks):
    ranks.run(_spin)


def test_loses_a_rank_after_burning_cpu(cell, ranks):
    ranks.run(_spin_then_exit_on_rank_1)


def test_burns_cpu_then_fails(cell, ranks):
    ranks.run(_spin_then_fail)
"""


def test_messages_are_normalised_and_modules_named():
    assert normalised("tensor at 0x7f3a9c0 line 41 in /tmp/pytest-7/x.py:88") == "tensor at 0x… line N in /tmp/…"
    assert module_of("/v/lib/python3.11/site-packages/torch/distributed/fsdp/_init_utils.py") == (
        "torch.distributed.fsdp._init_utils"
    )


def test_a_ranks_cpu_counts_the_children_it_waited_for():
    """Inductor compiles each kernel in a C++ compiler child; a rank's figure without it missed most
    of a compiled test's CPU (the modern-stack cell: about 330 of 481 CPU seconds)."""
    before = process_cpu_seconds()
    spin = "import time\nuntil = time.process_time() + 0.3\nwhile time.process_time() < until: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)
    assert process_cpu_seconds() - before >= 0.3


def test_a_process_cpu_read_from_outside_is_what_it_counts_itself():
    """The pool reads a rank's CPU this way just before it stops the rank."""
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert abs(cpu_seconds_of(os.getpid()) - process_cpu_seconds()) < 0.05
    assert cpu_seconds_of(2**22 + 1) is None, "no such process: nothing to read"


def record(torch: str, cell: str, *warnings: tuple[str, str, str, int]) -> TestRecord:
    entries = tuple({"category": c, "module": m, "message": t, "count": n} for c, m, t, n in warnings)
    return TestRecord(torch, cell, "resume", "test_x", "passed", 1.0, warnings=entries)


def test_a_warning_on_one_version_only_is_new_there_and_deprecations_come_first():
    shared = ("UserWarning", "torch.distributed", "Multiple backends are registered", 2)
    before = [record("2.13.0", "ws1", shared, ("UserWarning", "m", "only the pin warns", 1))]
    after = [
        record("2.15.0", "ws1", shared, ("UserWarning", "m", "noisy", 9)),
        record("2.15.0", "ws2", ("FutureWarning", "torch.distributed._shard", "deprecating ShardedTensor", 1)),
    ]
    new, gone = new_and_gone(before, after)
    assert [(g.category, g.message, g.count, g.tests, g.cells) for g in new] == [
        ("FutureWarning", "deprecating ShardedTensor", 1, ("resume::test_x",), ("ws2",)),
        ("UserWarning", "noisy", 9, ("resume::test_x",), ("ws1",)),
    ]
    assert [g.message for g in gone] == ["only the pin warns"]


@pytest.mark.slow
def test_ranks_and_pytest_warnings_and_cpu_time_reach_results_json(tmp_path):
    project = Project(tmp_path / "project")
    project.write_suites(matrix_toml(axes={"world_size": [2]}, suites={"usage": {"timeout": 60}}), test_usage=SUITE)
    done = project.torchmatrix("run", "--torch", "system", "--reports", "out", "--confirm-limit", "0")
    assert done.returncode == 1, done.stdout + done.stderr
    assert project.torchmatrix("report", "out/latest").returncode == 0
    tests = {t["test"]: t for t in json.loads((project.root / "out" / "latest" / "results.json").read_text())["tests"]}
    warned = {(w["category"], w["module"], w["message"]): w["count"] for w in tests["test_warns"]["warnings"]}
    assert warned == {
        ("FutureWarning", "test_usage", "old_api at 0x… is deprecating ShardedTensor, rank 0"): 3,
        ("FutureWarning", "test_usage", "old_api at 0x… is deprecating ShardedTensor, rank 1"): 3,
        ("UserWarning", "test_usage", "in the pytest process, see line N"): 1,
    }
    assert tests["test_burns_cpu"]["warnings"] == []
    spin, warn = tests["test_burns_cpu"]["figures"]["cpu_seconds"], tests["test_warns"]["figures"]["cpu_seconds"]
    assert spin > 0.5 and spin > 4 * warn, (spin, warn)
    failed = tests["test_burns_cpu_then_fails"]
    assert failed["status"] == "failed", failed
    assert failed["figures"]["cpu_seconds"] > spin / 2, "the ranks a failure stopped still count what they used"
    lost = tests["test_loses_a_rank_after_burning_cpu"]
    assert lost["status"] == "failed", lost
    assert lost["figures"].get("cpu_seconds", spin) > spin / 2, "a dead rank's CPU is read, or the test has no figure"
