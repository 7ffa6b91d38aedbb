"""The order the tests start in: the costliest files first, so that xdist, which hands tests (or
whole files, under --dist loadscope) out in collection order, fills the workers' tails with short ones."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# The files whose tests cost the most, longest first (CI's --durations summed per file, 85 to 530 s
# each; the resume mutants, cross_version, third-party and torchtitan files placed again after their
# runs were merged, issue 44 item 8): a file goes whole to one worker, so these start first and short
# ones fill the tails.
LONGEST_FIRST = (
    "suites/test_third_party_optim.py",
    "suites/test_cross_version.py",
    "bisect/test_bisect_e2e.py",
    "suites/test_grad_ckpt_compile.py",
    "suites/test_grad_ckpt_compile_mutants.py",
    "faults/test_containment.py",
    "suites/test_resume_mutants.py",
    "suites/test_grad_ckpt_mutants.py",
    "suites/test_dtensor_mutants.py",
    "faults/test_drills.py",
    "suites/test_torchtitan_example.py",
    "sensitivity/test_sensitivity.py",
    "suites/test_mesh_mutants.py",
    "suites/test_optimizer_impl_mutants.py",
    "test_benches.py",
    "scale/test_scale_out.py",
    "env/test_torch_install.py",
    "suites/test_parallel_equivalence_mutants.py",
    "suites/test_hf_llama_example.py",
    "suites/test_grad_ckpt_forms.py",
    "components/test_component_check.py",
    "run/test_slowdown_bench.py",
)


def expected_cost_rank(item) -> int:
    """Where an item starts: its file's place in LONGEST_FIRST, else after them, slow before fast."""
    path = Path(item.path).resolve()
    relative = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else ""
    if relative in LONGEST_FIRST:
        return LONGEST_FIRST.index(relative)
    return len(LONGEST_FIRST) + (0 if item.get_closest_marker("slow") else 1)
