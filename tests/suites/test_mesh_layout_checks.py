"""dtensor_optim's 2-D mesh checks in one process: the sharded-save check against the blocks a param is
split into (fewer than the ranks where a dim replicates), and the tensor-parallel plan's expectations."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

from suites.checkpoints.dcp_layout import Chunk, ExpectedState, TensorLayout, storage_findings
from suites.sharding.mesh_placements import TensorParallelPlan, _same_placement

PARAM = (4, 3)
# HSDP 2 x 2: ranks 0 and 2 hold rows 0-1, ranks 1 and 3 rows 2-3
HSDP_BLOCKS = frozenset({((0, 0), (2, 3)), ((2, 0), (2, 3))})


def stored(*chunks: tuple[tuple[int, int], tuple[int, int], int]) -> dict[str, TensorLayout]:
    key = "optimizer.state.w.exp_avg"
    return {key: TensorLayout(key, PARAM, torch.float32, tuple(Chunk(o, s, w) for o, s, w in chunks))}


def findings_of(layouts: dict[str, TensorLayout]):
    return storage_findings(layouts, [ExpectedState("w.exp_avg", None, PARAM, HSDP_BLOCKS)], world_size=4)


def test_hsdp_state_stored_once_per_block_is_sharded():
    """DCP keeps one copy of a replicated block, so 2 chunks over 4 ranks is right."""
    findings = findings_of(stored(((0, 0), (2, 3), 0), ((2, 0), (2, 3), 3)))
    assert findings.problems == [] and findings.lines[0].startswith("stored sharded: 1 of 1")


def test_state_stored_whole_names_the_blocks_of_its_param():
    findings = findings_of(stored(((0, 0), (4, 3), 0)))
    assert (
        "expected 2 chunks, one per block its param is split into (replicas store theirs once)" in findings.problems[0]
    )


def test_state_cut_otherwise_than_its_param_is_caught():
    findings = findings_of(stored(((0, 0), (4, 2), 0), ((0, 2), (4, 1), 1)))
    assert (
        findings.problems
        and "chunks cut otherwise than its param, whose blocks are [2, 3] at [0, 0], [2, 3] at [2, 0]"
        in findings.problems[0]
    )


def test_the_plan_says_which_placement_each_projection_has_on_tp():
    plan = TensorParallelPlan.from_option(None)
    assert plan.expected_tp_placement("layers.0.q_proj.weight") == Shard(0)
    assert plan.expected_tp_placement("layers.0.o_proj.weight") == Shard(1)
    assert plan.expected_tp_placement("layers.0.o_proj.bias") == Replicate()
    assert plan.expected_tp_placement("layers.0.attn_norm.weight") == Replicate()
    assert plan.expected_tp_placement("layers.0.not_q_proj.weight") == Replicate()  # a name, not a substring
    assert plan.unmatched(["layers.0.q_proj.weight", "layers.0.o_proj.weight"]) == [
        "k_proj",
        "v_proj",
        "mlp_in",
        "mlp_out",
    ]
    assert _same_placement(Shard(-1), Shard(1), ndim=2) and not _same_placement(Replicate(), Shard(1), ndim=2)


def test_a_plan_option_with_an_unknown_style_says_which():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['sequence'\]; use colwise and rowwise"):
        TensorParallelPlan.from_option({"colwise": ["wq"], "sequence": ["norm"]})
