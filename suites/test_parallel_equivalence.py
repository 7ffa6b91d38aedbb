"""Parallel equivalence: each step of a cell's sharded training is a step of single-process training.

- Reference: the `model` built again from the same seed and wrapped by `parallelize` without
  parallelism and without compiling (`fsdp = "none"`, `mesh = "flat"`, `compile = "none"`), in a world
  of one rank of its own (suites/references/single_process_reference.py), so a component that reads the world's
  size or rank sees one process there; it runs every shard of the global batch and takes their mean.
  No cell depends on another, so `--shard`/`merge` work as for any suite.
- The cell trains in its own world as it would alone and writes what it computed; the reference then
  trains beside those records (suites/references/lockstep.py). Compared per step (table and derivations:
  docs/explanation/parallel-equivalence.md): each rank's loss (bit for bit; under tensor parallelism
  within suites/comparison/reordered_sums.py's first-order bound); the reduced gradient (the declared
  `reduce_dtype`'s reduction bound, suites/comparison/summation_bounds.py, and values that dtype's sums produce:
  pytorch#190626); the `clip_grad_norm` norm against the whole gathered gradient's and the
  single-process mean's (pytorch#170862), and the clipping it drives; the parameters after the same
  optimizer step fed the cell's clipped gradient once that gradient passed (bit for bit).
- Under tensor parallelism the gradient is compared through linear functionals (per tensor its sign
  pattern, a random and the unit direction; suites/comparison/gradient_functionals.py), each within its
  first-order bound from a second backward of the reference, and the norm through the unit one.
- A cell whose `accumulation` is not none runs `micro_batches` micro-batches per shard, sync off until
  the last (suites/references/accumulation.py); each gradient that is not the concatenated batch's is named with
  what it holds instead (only the last micro-batch, a bf16 accumulation, a reduction per micro-batch).
- A cell whose `pipeline` is not none trains its model split into stages over two pipeline ranks (FSDP2
  over the rest), one schedule step over `micro_batches` micro-batches per shard (suites/references/pipelining.py);
  the reference runs the same micro-batches through the whole model. Each gradient that is not the global
  batch's mean is named with its stage and what it holds instead (a double average, a sum, only the last
  micro-batch). Components `pipeline_split` and `pipeline_schedule`.
- Cells with fsdp = "none" and pipeline = "none" skip. Components: `model`, `batch`, `parallelize`, `optimizer_<optimizer>`,
  optionally `clip_grad_norm` (default: suites/components/gradient_clipping.py) and `training_step` (its `loss`,
  `backward` and `optimizer_step`, built once for the cell's model and once for the reference;
  suites/components/training_step.py).
"""

from __future__ import annotations

import pytest

from torchmatrix.components.accumulation_axis import accumulates, accumulation_of
from torchmatrix.components.pipeline_axis import PIPELINE_RANKS, pipeline_of, pipelines, stage_count
from torchmatrix.testing import REDUCE_DTYPES, ParallelEquivalenceOptions

from .comparison.step_comparisons import GRID_EVIDENCE, NARROWER
from .comparison.summation_bounds import MeanReduction
from .references.lockstep import lockstep_records
from .references.lockstep_steps import LockstepRecord, LockstepStep, LockstepUnavailable

OPTIONS = ParallelEquivalenceOptions  # the dataclass `suite_options` arrives as

NO_PARALLELISM = (
    "fsdp=none, pipeline=none: no data-parallel wrapper and no pipeline, so there is nothing parallel to compare with "
    "the single-process run"
)


@pytest.fixture(autouse=True)
def parallel_cell(cell):
    if cell["fsdp"] == "none" and not pipelines(cell):
        pytest.skip(NO_PARALLELISM)


@pytest.fixture
def lockstep(cell, ranks, suite_options, components, once_per_cell, tmp_path) -> list[LockstepRecord]:
    """The cell's training and its single-process reference, step by step, one record per rank; run once per cell."""
    options = suite_options
    if "optimizer" not in cell:
        pytest.fail(
            "the cell has no optimizer axis: parallel_equivalence trains with [components] optimizer_<value>; "
            'add an axis such as optimizer = ["adamw"]',
            pytrace=False,
        )
    records = once_per_cell(
        "the lockstep training",
        lambda: lockstep_records(ranks, dict(cell), options, dict(components), tmp_path),
    )
    if isinstance(records[0], LockstepUnavailable):
        pytest.skip(records[0].reason)
    return records


LISTED = 12
"""Problem lines a failure message shows before it counts the rest."""


def listing(lines: list[str]) -> str:
    """The first LISTED lines, indented, and how many more there are."""
    shown = [f"  {line}" for line in lines[:LISTED]]
    if len(lines) > LISTED:
        shown.append(f"  ... and {len(lines) - LISTED} more")
    return "\n".join(shown)


def fail_on(problems: list[str], what: str, hint: str) -> None:
    """Fail with `what`, the listed problem lines and the hint, where there are any: one form for every check."""
    if problems:
        raise AssertionError(f"{what}:\n" + listing(problems) + f"\n  hint: {hint}")


def collapsed(per_rank: list[list[str]]) -> str:
    """Per-rank problem lines, once under "every rank" where all ranks found the same."""
    if len(per_rank) > 1 and all(lines == per_rank[0] for lines in per_rank):
        return listing([f"every rank: {line}" for line in per_rank[0]])
    return listing([f"rank {rank}: {line}" for rank, lines in enumerate(per_rank) for line in lines])


def forward_is_single_process(records: list[LockstepRecord]) -> bool:
    """Whether each rank's forward is the single-process forward of its shard: no tensor-parallel split."""
    return not records[0].tensor_parallel


TENSOR_PARALLEL_GRADIENTS = (
    "under tensor parallelism, linear functionals of it (per tensor its sign pattern; over every tensor a random "
    "±1 direction and the unit direction) each within its first-order bound of the linear layers summing in "
    "another order (suites/comparison/reordered_sums.py)"
)


def test_losses_match_single_process(cell, lockstep, record_property):
    """Each rank's loss on its shard equals the single-process loss of that shard, every step: bit for
    bit where the forward is the single-process one; under tensor parallelism within the first-order
    bound of its linear layers summing in another order (suites/comparison/reordered_sums.py)."""
    records = lockstep
    record_property("reference_world", records[0].reference_world)
    steps = [step for record in records for step in record.steps]
    record_property("loss_max_abs", max(abs(step.loss - step.reference_loss) for step in steps))
    if forward_is_single_process(records):
        record_property("loss_max_ulp", max(step.loss_ulp for step in steps))
        allowed, expected = (lambda step: 0.0), "bit for bit: the same kernels on the same gathered parameters"
    else:
        record_property("loss_max_ratio", max(abs(step.loss - step.reference_loss) / step.loss_bound for step in steps))
        allowed = lambda step: step.loss_bound  # noqa: E731
        expected = "within the first-order bound of tensor parallelism's linear layers summing in another order"
    per_rank = [
        [
            f"step {index}: loss {step.loss!r}, single-process {step.reference_loss!r}: |diff| "
            f"{abs(step.loss - step.reference_loss):.3e} ({step.loss_ulp} ULP), allowed {allowed(step):.3e}"
            for index, step in enumerate(record.steps)
            if abs(step.loss - step.reference_loss) > allowed(step)
        ]
        for record in records
    ]
    assert not any(per_rank), (
        f"{cell.id}: the parallel forward computes another loss than the single-process forward of the same shard "
        f"({expected}):\n"
        + collapsed(per_rank)
        + "\n  hint: a component divides by the world's size (dist.get_world_size(), a mesh's size) on top of the "
        "wrapper's mean (the reference runs in a world of one rank), parallelize changed the computation (a cast, "
        "another attention kernel, a tensor-parallel plan that drops a partial sum), or the gathered parameters "
        "differ from the reference's (see test_parameters_match_single_process_step)"
    )


def test_reduced_gradients_match_single_process(cell, lockstep, suite_options, record_property):
    """After the data-parallel reduction, the whole gradient equals the single-process mean gradient of
    the global batch within the derived reduction bound (bit for bit at two shards or fewer); under
    tensor parallelism through linear functionals, each within its first-order bound."""
    records = lockstep
    reduction = MeanReduction(records[0].shards, suite_options.reduce_dtype)
    steps = records[0].steps
    record_property("precision", reduction.describe())
    if not forward_is_single_process(records):
        record_property("grad_functional_max_ratio", max(step.gradient.max_ratio for step in steps))
        expected = TENSOR_PARALLEL_GRADIENTS
    else:
        record_property("grad_max_abs", max(step.gradient.max_abs for step in steps))
        if reduction.exact:
            record_property("grad_max_ulp", max(step.gradient.max_ulp for step in steps))
        else:
            record_property("grad_max_ratio", max(step.gradient.max_ratio for step in steps))
        expected = f"within what the reduction order allows: {reduction.describe()}"
    problems = [f"step {index}: {line}" for index, step in enumerate(steps) for line in step.gradient.problems]
    fail_on(
        problems,
        f"{cell.id}: after the data-parallel reduction the gradient differs from the single-process mean gradient "
        f"of the same global batch ({expected})",
        "a reduction in a narrower dtype than declared ([suites.parallel_equivalence.options] reduce_dtype), "
        "a division by the wrong world size, a reduction over the wrong ranks, or a tensor-parallel plan that "
        "reduces an input's gradient twice or never",
    )


def test_gradients_reduced_in_declared_dtype(cell, lockstep, suite_options):
    """No gradient after the reduction lies wholly on the grid of a dtype narrower than the declared
    one: its sum ran in that narrower dtype (the pytorch#190626 class), whatever the reduction order."""
    declared = suite_options.reduce_dtype
    if not NARROWER[declared]:
        pytest.skip(f"reduce_dtype = {declared!r}: no narrower dtype among {', '.join(REDUCE_DTYPES)} to tell apart")
    steps = lockstep[0].steps
    if not any(step.grid_checked for step in steps):
        pytest.skip(
            f"no gradient had {GRID_EVIDENCE} nonzero elements: too few to tell an fp32 sum from a narrower one"
        )
    problems = [f"step {index}: {line}" for index, step in enumerate(steps) for line in step.narrow_grid]
    fail_on(
        problems,
        f"{cell.id}: gradients after the data-parallel reduction hold only values of a dtype narrower than the "
        f"declared reduce_dtype = {declared!r}, so they were summed in that dtype (an fp32 sum lands on bf16's grid "
        f"about once in 2**16 elements)",
        "a mixed-precision policy whose reduce_dtype is narrower than declared, or a reduction "
        "(a tensor-parallel all-reduce, say) that ignores it",
    )


def test_gradient_norm_is_the_whole_models(cell, lockstep, record_property):
    """On every rank, the norm the clip returns is the 2-norm of the whole gathered gradient, within
    the worst-case rounding of a norm of that many elements, and the single-process mean gradient's
    norm within that plus the gradient's own bound: not a shard's partial norm, nor another model's."""
    records = lockstep
    steps = [step for record in records for step in record.steps]
    record_property("norm_max_rel", max(step.norm.relative_error for step in steps))
    record_property("norm_tolerance_rel", records[0].norm_tolerance)
    record_property("norm_single_process_max_abs", max(step.norm.single_process_error for step in steps))
    per_rank = [
        [line for index, step in enumerate(record.steps) for line in norm_problems(index, step, record)]
        for record in records
    ]
    assert not any(per_rank), (
        f"{cell.id}: the gradient norm clip_grad_norm returns is not the norm of the whole model's gradient "
        f"(tolerance: the worst-case rounding of a 2-norm of {records[0].elements} elements, and against the "
        f"single-process mean gradient's norm also the gradient's own reduction bound):\n"
        + collapsed(per_rank)
        + "\n  hint: a norm over this rank's shards only (torch.nn.utils.clip_grad_norm_ on FSDP1, or over "
        "DTensor.to_local() grads) misses the other ranks' parts; reduce the squared norms across ranks first"
    )


def norm_problems(index: int, step: LockstepStep, record: LockstepRecord) -> list[str]:
    """What is wrong with one step's norm on one rank; the single-process figures are the reference's
    own, computed in its world of one rank."""
    norm = step.norm
    figures = (
        f"clip_grad_norm returned {norm.returned!r}; the gathered gradient's norm is {norm.exact!r}, the "
        f"single-process mean gradient's {norm.single_process!r} (the clip in one process: "
        f"{norm.single_process_clip!r})"
    )
    problems = []
    if norm.relative_error > record.norm_tolerance:
        problems.append(
            f"step {index}: {figures}; relative error to the gathered {norm.relative_error:.3e}, "
            f"tolerance {record.norm_tolerance:.3e}"
        )
    tolerance = norm.single_process_tolerance
    if norm.single_process_error > tolerance:
        problems.append(
            f"step {index}: {figures}; |returned - single-process| {norm.single_process_error:.3e}, "
            f"tolerance {tolerance:.3e}"
        )
    return problems


def test_clipping_scales_by_the_whole_norm(cell, lockstep, record_property):
    """The clipped gradient is the gathered gradient times min(1, max_norm / (norm + 1e-6)) of the whole
    norm, within that norm's rounding bound; max_norm makes the first step clip."""
    records = lockstep
    steps = records[0].steps
    record_property("clipped_steps", [index for index, step in enumerate(steps) if step.clip.coefficient < 1])
    record_property("clip_max_ratio", max(step.clip.max_ratio for step in steps))
    problems = [f"step {index}: {line}" for index, step in enumerate(steps) for line in step.clip.problems]
    fail_on(
        problems,
        f"{cell.id}: clipping did not scale the whole gradient by the coefficient of the whole norm "
        f"(max_norm {records[0].max_norm!r}; tolerance {records[0].clip_tolerance:.3e} x |g x coefficient|)",
        "each rank clipped by its own shard's norm, or the clip used another norm than the whole model's",
    )


def test_parameters_match_single_process_step(cell, lockstep):
    """Before training and after every step, the gathered parameters equal the single-process
    optimizer's step on the same clipped gradient, bit for bit."""
    records = lockstep
    per_rank = [record.initial_parameters for record in records]
    assert not any(per_rank), (
        f"{cell.id}: before any step, the parallel model's gathered parameters differ from the single-process "
        f"model built from the same seed:\n" + collapsed(per_rank) + "\n  hint: the model factory is not "
        "deterministic under torch.manual_seed, or parallelize changed the weights"
    )
    per_rank = [
        [f"after step {index}: {line}" for index, step in enumerate(record.steps) for line in step.parameters]
        for record in records
    ]
    assert not any(per_rank), (
        f"{cell.id}: after the optimizer step the parallel run's parameters differ from the single-process optimizer's "
        f"step on the same clipped gradient (bit for bit expected: an elementwise update computes each element alike "
        f"on a shard and on the whole tensor):\n"
        + collapsed(per_rank)
        + "\n  hint: the sharded optimizer updates some elements differently (state kept per shard, a step count or "
        "a weight decay applied twice, an update that needs the whole tensor)"
    )


def test_micro_batches_accumulate_to_the_whole_batch(cell, lockstep, suite_options):
    """Where the cell accumulates micro-batches (axis `accumulation`, or a `pipeline` schedule), the reduced
    gradient after the step is the whole batch's: every micro-batch of every shard summed in float32, within
    the reduction bound (bit for bit at two shards); a gradient that is not is named with the fault that
    explains it (and under a pipeline, the stage that holds it)."""
    if not accumulates(cell) and not pipelines(cell):
        pytest.skip("accumulation=none, pipeline=none: one batch per shard and step, no micro-batches to accumulate")
    steps = lockstep[0].steps
    problems = [f"step {index}: {line}" for index, step in enumerate(steps) for line in step.micro_batches]
    if not problems:
        return
    if pipelines(cell):
        raise AssertionError(
            f"{cell.id}: after the {pipeline_of(cell)} schedule's step over {suite_options.micro_batches} micro-batches "
            f"and {stage_count(cell)} stages on {PIPELINE_RANKS} pipeline ranks, the gradient is not the global batch's "
            "mean (each micro-batch's mean loss through the whole model, their gradients summed in float32 and divided "
            "by their count once):\n"
            + listing(problems)
            + "\n  hint: scale_grads must match the loss: True (the default) for each micro-batch's mean, False for a "
            "loss already divided by the micro-batch count before the schedule's backward; a stage must keep what "
            "earlier micro-batches accumulated until the step's last backward"
        )
    raise AssertionError(
        f"{cell.id}: after {suite_options.micro_batches} micro-batches with gradient sync off then one synced "
        f"backward (accumulation={accumulation_of(cell)!r}), the gradient is not the concatenated batch's:\n"
        + listing(problems)
        + "\n  hint: the accumulated gradient must stay in float32 (reduce_dtype) whatever param_dtype computes, "
        "keep every micro-batch's contribution, and be reduced once, after the last micro-batch"
    )
