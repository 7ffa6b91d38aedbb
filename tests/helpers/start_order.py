"""The order the tests start in: the costliest files first, so that xdist, which hands tests (or
whole files, under --dist loadscope) out in collection order, fills the workers' tails with short ones."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# The files whose tests cost the most, longest first (per-test CPU and wall seconds of the full lane,
# issue 44 item 8, re-placed after the 2026-11-27 cuts: the slowdown bench's smoke size, containment's
# 10 s deadline and the bisect searches that start from a run left the list or moved down; the files of
# 2026-12-06 placed by that day's full lane): a file goes
# whole to one worker, so these start first and short ones fill the tails.
LONGEST_FIRST = (
    "suites/test_cross_version.py",
    "suites/test_third_party_optim.py",
    "suites/test_lightning_example.py",
    "bisect/test_bisect_e2e.py",
    "hostile/test_run_exits.py",  # about 100 s of it waiting on real deadlines: best beside the CPU-bound files
    "suites/test_dtensor_mutants.py",
    "suites/test_torchtitan_example.py",
    "suites/test_resume_mutants.py",
    "sensitivity/test_sensitivity.py",
    "suites/test_grad_ckpt_compile_mutants.py",
    "suites/test_peak_memory.py",
    "suites/test_grad_ckpt_mutants.py",
    "faults/test_drills.py",
    "suites/test_grad_ckpt_compile.py",
    "suites/test_mesh_mutants.py",
    "suites/test_optimizer_impl_mutants.py",
    "env/test_torch_install.py",
    "test_benches.py",
    "scale/test_scale_out.py",
    "suites/test_parallel_equivalence_mutants.py",
    "suites/test_hf_llama_example.py",
    "suites/test_grad_ckpt_forms.py",
    "faults/test_containment.py",
    "suites/test_wrapper_chain.py",
    "hostile/test_upstream_without_machine_paths.py",
    "suites/test_accelerate_example.py",
    "ranks/test_truncated_kernel_builds.py",
    "suites/test_stack_loaders.py",
    "components/test_component_check.py",
)


def expected_cost_rank(item) -> int:
    """Where an item starts: its file's place in LONGEST_FIRST, else after them, slow before fast."""
    path = Path(item.path).resolve()
    relative = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else ""
    if relative in LONGEST_FIRST:
        return LONGEST_FIRST.index(relative)
    return len(LONGEST_FIRST) + (0 if item.get_closest_marker("slow") else 1)
