"""The `pipeline` axis as data: its schedules, how many stages each splits the model into, and the cells it
cannot train (refused when matrix.toml loads, naming the cell)."""

from __future__ import annotations

import pytest

from torchmatrix.components.pipeline_axis import pipeline_problem, pipelines, stage_count
from torchmatrix.matrix.config import ConfigError, load_matrix

from helpers.matrix_files import write_matrix


def test_each_schedule_splits_the_model_over_two_pipeline_ranks():
    assert not pipelines({}) and not pipelines({"pipeline": "none"})
    assert [stage_count({"pipeline": kind}) for kind in ("gpipe", "1f1b", "interleaved_1f1b")] == [2, 2, 4]
    with pytest.raises(ValueError, match="pipeline='zbv': expected one of none, gpipe, 1f1b, interleaved_1f1b"):
        pipelines({"pipeline": "zbv"})


@pytest.mark.parametrize(
    ("cell", "problem"),
    [
        ({"world_size": 2, "fsdp": "none"}, None),
        ({"world_size": 4, "fsdp": "fsdp2"}, None),
        ({"world_size": 1, "fsdp": "none"}, "world_size 1 is not a multiple"),
        ({"world_size": 2, "fsdp": "fsdp1"}, "fsdp='fsdp1' has no stage hook"),
        ({"world_size": 4, "fsdp": "none"}, "2 data-parallel ranks per stage: they need fsdp='fsdp2'"),
        ({"world_size": 4, "fsdp": "fsdp2", "mesh": "hsdp"}, "mesh must be 'flat'"),
        ({"world_size": 2, "fsdp": "none", "accumulation": "bf16"}, "accumulation must be 'none'"),
    ],
)
def test_a_pipelined_cell_composes_with_some_wrappers_only(cell, problem):
    found = pipeline_problem({**cell, "pipeline": "1f1b"})
    assert found == problem if problem is None else problem in found


def test_a_matrix_with_a_pipelined_cell_that_cannot_train_is_refused_naming_it(tmp_path):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "test_demo.py").write_text("def test_x(cell):\n    pass\n")
    path = write_matrix(
        tmp_path,
        axes={"world_size": [1, 2], "fsdp": ["none"], "pipeline": ["none", "gpipe"]},
        suites={"demo": {}},
    )
    with pytest.raises(ConfigError, match=r"axes\.pipeline: cell ws1-none-gpipe: pipeline='gpipe' splits the model"):
        load_matrix(path)
