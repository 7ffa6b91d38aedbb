"""The `pipeline` axis: which `torch.distributed.pipelining` schedule a cell trains its decoder under,
split into stages over PIPELINE_RANKS ranks (data-parallel over the rest, FSDP2). The rank side builds
the ("pp", "dp_shard") mesh from it (torchmatrix.matrix.meshes); parallel_equivalence runs the step."""

from __future__ import annotations

from collections.abc import Mapping

PIPELINE_AXIS = "pipeline"
NO_PIPELINE = "none"
STAGES_PER_RANK = {"gpipe": 1, "1f1b": 1, "interleaved_1f1b": 2}
"""Per schedule, the stages each pipeline rank holds: the interleaved schedule loops over two per rank."""
PIPELINE_KINDS = (NO_PIPELINE, *STAGES_PER_RANK)
PIPELINE_RANKS = 2
"""Pipeline ranks of every pipelined cell: pp=2 alone at two ranks, pp=2 x FSDP2 over two at four."""


def pipeline_of(cell: Mapping[str, object]) -> str:
    """The cell's pipeline value (`none` where the cell has no such axis); a value the axis does not know
    is an error naming the ones it does."""
    value = str(cell.get(PIPELINE_AXIS, NO_PIPELINE))
    if value not in PIPELINE_KINDS:
        raise ValueError(f"cell axis pipeline={value!r}: expected one of {', '.join(PIPELINE_KINDS)}")
    return value


def pipelines(cell: Mapping[str, object]) -> bool:
    """Whether the cell trains its model split into pipeline stages."""
    return pipeline_of(cell) != NO_PIPELINE


def pipeline_ranks(cell: Mapping[str, object]) -> int:
    """The size of the cell's pipeline dimension: PIPELINE_RANKS where it pipelines, else 1."""
    return PIPELINE_RANKS if pipelines(cell) else 1


def stage_count(cell: Mapping[str, object]) -> int:
    """How many stages the cell's model is split into: STAGES_PER_RANK of its schedule on each pipeline rank."""
    return PIPELINE_RANKS * STAGES_PER_RANK[pipeline_of(cell)]


def pipeline_problem(cell: Mapping[str, object]) -> str | None:
    """Why no rank can train the cell pipelined (a world size, wrapper, mesh or accumulation it does not
    compose with), or None; checked when matrix.toml loads."""
    if not pipelines(cell):
        return None
    world_size = int(cell.get("world_size", 1))
    if world_size < PIPELINE_RANKS or world_size % PIPELINE_RANKS:
        return f"pipeline={pipeline_of(cell)!r} splits the model over {PIPELINE_RANKS} ranks: world_size {world_size} is not a multiple"
    fsdp = str(cell.get("fsdp", "none"))
    if fsdp == "fsdp1":
        return "pipelining shards a stage with FSDP2 (fully_shard) or not at all: fsdp='fsdp1' has no stage hook"
    if fsdp == "none" and world_size > PIPELINE_RANKS:
        return f"world_size {world_size} leaves {world_size // PIPELINE_RANKS} data-parallel ranks per stage: they need fsdp='fsdp2'"
    if str(cell.get("mesh", "flat")) != "flat":
        return "a pipelined cell builds its own ('pp', 'dp_shard') mesh: mesh must be 'flat'"
    if str(cell.get("accumulation", "none")) != "none":
        return "a pipeline schedule accumulates its own micro-batches: accumulation must be 'none'"
    return None
