"""The order the tests start in: the costliest files first, so that xdist, which hands tests (or
whole files, under --dist loadscope) out in collection order, fills the workers' tails with short ones."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# The files whose tests take longest, longest first: each file's wall seconds in the full lane of
# 2026-12-07's night (TORCHMATRIX_TEST_CPU_LOG, helpers/cpu_seconds.py), every file of 20 s or more. A
# file goes whole to one worker, so these start first and short ones fill the tails.
LONGEST_FIRST = (
    "hostile/test_run_exits.py",  # about 100 s of it waiting on real deadlines: best beside the CPU-bound files
    "bisect/test_bisect_e2e.py",
    "test_benches.py",
    "suites/test_third_party_optim.py",
    "suites/test_cross_version.py",
    "suites/test_dtensor_mutants.py",
    "faults/test_drills.py",
    "suites/test_optimizer_impl_mutants.py",
    "suites/test_peak_memory.py",
    "suites/test_grad_ckpt_compile_mutants.py",
    "suites/test_mesh_mutants.py",
    "env/test_torch_install.py",
    "suites/test_torchtitan_example.py",
    "components/test_component_check.py",
    "ranks/test_compile_store.py",
    "run/test_known_failures_e2e.py",
    "sensitivity/test_sensitivity.py",
    "suites/test_grad_ckpt_mutants.py",
    "suites/test_grad_ckpt_compile.py",
    "test_nox_sessions.py",
    "suites/test_resume_mutants.py",
    "ranks/test_mesh_cache_keys.py",
    "ranks/test_compile_cache.py",
    "suites/test_parallel_equivalence_mutants.py",
    "faults/test_containment.py",
    "ranks/test_truncated_kernel_builds.py",
    "suites/test_lightning_example.py",
    "scale/test_slurm.py",
    "ranks/test_aot_eager_store.py",
    "forks/test_preloaded_forks.py",
    "ranks/test_pool.py",
    "ranks/test_run_order.py",
    "suites/test_accelerate_example.py",
    "hostile/test_foreign_run_directories.py",
    "suites/test_training_forms.py",
    "suites/test_hf_llama_example.py",
    "run/test_slowdown_bench.py",
    "bisect/test_cross_version_repro.py",
)


def expected_cost_rank(item) -> int:
    """Where an item starts: its file's place in LONGEST_FIRST, else after them, slow before fast."""
    path = Path(item.path).resolve()
    relative = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else ""
    if relative in LONGEST_FIRST:
        return LONGEST_FIRST.index(relative)
    return len(LONGEST_FIRST) + (0 if item.get_closest_marker("slow") else 1)
