"""What parallel_equivalence's lockstep hands its tests, typed: per rank a `LockstepRecord`, per step
a `LockstepStep` of the loss, gradient, norm, clip and parameters against the single-process
reference. Rank processes pickle them to the pytest process, so they live in an importable module."""

from __future__ import annotations

from dataclasses import dataclass

from ..comparison.step_comparisons import ClipComparison, GradientComparison


@dataclass(frozen=True)
class NormComparison:
    """The norm one rank's clip returned against the gathered gradient's 2-norm and the single-process
    mean gradient's, with the tolerance the latter is held to."""

    returned: float
    exact: float
    single_process: float
    single_process_clip: float
    """What the clip returns in the single process, on the mean gradient."""
    relative_error: float
    """|returned - exact| / exact."""
    single_process_error: float
    single_process_tolerance: float


@dataclass(frozen=True)
class LockstepStep:
    """One step of one rank against the reference: its loss on its shard, and the gathered tensors'
    comparisons, which every rank shares."""

    loss: float
    reference_loss: float
    loss_ulp: int
    loss_bound: float
    gradient: GradientComparison
    norm: NormComparison
    clip: ClipComparison
    narrow_grid: list[str]
    """Gradients whose every nonzero element lies on a narrower dtype's grid than the declared one."""
    grid_checked: bool
    elements: int
    parameters: list[str]
    """What differs in the parameters after the step; empty where the reference could not vouch for the gradient."""
    micro_batches: list[str]
    """Gradients that are not the whole batch's, where the cell accumulates or pipelines micro-batches."""


@dataclass(frozen=True)
class LockstepRecord:
    """One rank's steps, up to the first whose gradient or parameters differ, and the bounds they were held to."""

    shards: int
    tensor_parallel: bool
    initial_parameters: list[str]
    steps: list[LockstepStep]
    elements: int
    max_norm: float
    norm_tolerance: float
    clip_tolerance: float
    reference_world: str = ""
    """Where the reference ran: a world of one rank of its own, or the cell's (lockstep.IN_THE_CELLS_WORLD)."""


@dataclass(frozen=True)
class LockstepUnavailable:
    """The cell's optimizer implementation cannot be built here: the suite's tests skip, saying why."""

    reason: str
