"""Fixtures the runner's tests share, and the order they start in; the helpers they import are in
tests/helpers/."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.projects import Project

TESTS = Path(__file__).resolve().parent
# The files whose tests cost the most (CI's --durations), longest first.
LONGEST_FIRST = (
    "suites/test_grad_ckpt_mutants.py",
    "suites/test_grad_ckpt_compile.py",
    "suites/test_grad_ckpt_inductor.py",
    "faults/test_containment.py",
    "suites/test_third_party_optim.py",
    "suites/test_cross_version.py",
    "bisect/test_bisect_e2e.py",
    "suites/test_resume_mutants.py",
    "run/test_slowdown_bench.py",
    "env/test_torch_install.py",
    "suites/test_dtensor_mutants.py",
    "sensitivity/test_sensitivity.py",
    "suites/test_mesh_mutants.py",
    "suites/test_torchtitan_example.py",
    "faults/test_drills.py",
    "suites/test_optimizer_impl_mutants.py",
    "suites/test_grad_ckpt_compile_mutants.py",
    "scale/test_scale_out.py",
    "suites/test_parallel_equivalence_mutants.py",
    "suites/test_hf_llama_example.py",
)


@pytest.fixture
def project(tmp_path) -> Project:
    return Project(tmp_path / "project")


def pytest_collection_modifyitems(config, items):
    """The longest files first, then the other slow tests, then the fast lane's: under `--dist
    loadscope --no-loadscope-reorder` (nox -s tests) each file goes whole to one worker in this order,
    so a module-scoped run is made once and the short files fill the workers' tails."""
    items.sort(key=expected_cost_rank)


def expected_cost_rank(item) -> int:
    """Where an item starts: its file's place in LONGEST_FIRST, else after them, slow before fast."""
    path = Path(item.path).resolve()
    relative = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else ""
    if relative in LONGEST_FIRST:
        return LONGEST_FIRST.index(relative)
    return len(LONGEST_FIRST) + (0 if item.get_closest_marker("slow") else 1)
