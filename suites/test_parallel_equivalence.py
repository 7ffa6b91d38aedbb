"""Parallel equivalence: each step of a cell's sharded training is a step of single-process training.

- Reference: the `model` built again from the same seed and wrapped for the same cell without
  parallelism (`fsdp = "none"`, `mesh = "flat"`), on every rank, so no cell depends on another and
  `--shard`/`merge` work as for any suite; it runs every shard of the global batch and takes their mean,
  on rank 0 alone (every rank's reference would compute the same bits), which sends it to the others.
- Compared per step (table and derivations: docs/explanation/parallel-equivalence.md): each rank's
  loss (bit for bit; under tensor parallelism within suites/loss_rounding.py's first-order bound);
  the reduced gradient (the declared `reduce_dtype`'s reduction bound, suites/summation_bounds.py, and
  values that dtype's sums produce: pytorch#190626); the `clip_grad_norm` norm of the whole gradient
  (pytorch#170862) and the clipping it drives; the parameters after the same optimizer step fed the
  cell's clipped gradient (bit for bit).
- Under tensor parallelism the gradients have no bound that follows from the reduction order: they
  are recorded (`grad_max_abs`), not compared.
- Cells with fsdp = "none" skip. Components: `model`, `batch`, `parallelize`, `optimizer_<optimizer>`,
  optionally `clip_grad_norm` (default: suites/gradient_clipping.py) and `training_step` (its `loss`,
  `backward` and `optimizer_step`, built once for the cell's model and once for the reference;
  suites/training_step.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from torchmatrix.testing import (
    REDUCE_DTYPES,
    ParallelEquivalenceOptions,
    UnavailableImplementation,
    build_optimizer,
    call_accepting,
    current_device,
    data_parallel_rank,
    data_parallel_size,
    implementation_of,
    load,
)

from .built_names import module_names, named_parameters_as_built, remember_built
from .deterministic import deterministic_algorithms
from .device_copies import on_device
from .full_tensors import full_gradients, full_parameters, whole
from .loss_rounding import linear_rounding_bound
from .parallelize_component import parallelized
from .summation_bounds import MeanReduction, clip_relative_bound, norm_relative_bound
from .training_step import build_training_step
from .ulp import bits_equal, ulp_distance

OPTIONS = ParallelEquivalenceOptions  # the dataclass `suite_options` arrives as

NARROWER = {"float32": ("bfloat16", "float16"), "bfloat16": (), "float16": ()}
GRID_EVIDENCE = 16
"""Nonzero elements of one gradient that must all lie on a narrower dtype's grid before the suite
concludes it was reduced there: an fp32 sum lands on bf16's grid by chance about once in 2**16, so
16 such elements happen by chance about once in 2**256."""
DEFAULT_CLIP = "torchmatrix.suites.gradient_clipping:clip_grad_norm"
CLIP_EPSILON = 1e-6
"""What torch.nn.utils.clip_grad_norm_ adds to the norm before dividing max_norm by it."""
NO_PARALLELISM = (
    "fsdp=none: no data-parallel wrapper, so there is nothing parallel to compare with the single-process run"
)


@pytest.fixture(autouse=True)
def parallel_cell(cell):
    if cell["fsdp"] == "none":
        pytest.skip(NO_PARALLELISM)


@pytest.fixture
def lockstep(cell, ranks, suite_options, components, once_per_cell) -> list[dict]:
    """The cell's training and its single-process reference, step by step, one record per rank; run once per cell."""
    options = suite_options
    if "optimizer" not in cell:
        pytest.fail(
            "the cell has no optimizer axis: parallel_equivalence trains with [components] optimizer_<value>; "
            'add an axis such as optimizer = ["adamw"]',
            pytrace=False,
        )
    records = once_per_cell(
        "the lockstep training", lambda: ranks.run(train_in_lockstep, dict(cell), options, dict(components))
    )
    if records[0].get("unavailable"):
        pytest.skip(records[0]["unavailable"])
    return records


LISTED = 12
"""Problem lines a failure message shows before it counts the rest."""


def listing(lines: list[str]) -> str:
    """The first LISTED lines, indented, and how many more there are."""
    shown = [f"  {line}" for line in lines[:LISTED]]
    if len(lines) > LISTED:
        shown.append(f"  ... and {len(lines) - LISTED} more")
    return "\n".join(shown)


def collapsed(per_rank: list[list[str]]) -> str:
    """Per-rank problem lines, once under "every rank" where all ranks found the same."""
    if len(per_rank) > 1 and all(lines == per_rank[0] for lines in per_rank):
        return listing([f"every rank: {line}" for line in per_rank[0]])
    return listing([f"rank {rank}: {line}" for rank, lines in enumerate(per_rank) for line in lines])


def forward_is_single_process(records: list[dict]) -> bool:
    """Whether each rank's forward is the single-process forward of its shard: no tensor-parallel split."""
    return not records[0]["tensor_parallel"]


GRADIENTS_UNDER_TENSOR_PARALLELISM = (
    "tensor parallelism sums the forward's and backward's partial products in another order (row-wise "
    "projections add up tp partial products), and that difference passes through every later layer: no bound "
    "on the gradients follows from the reduction order, so they were compared for the record only "
    "(grad_max_abs = {worst:.3e}); the loss, norm, clipping, reduce dtype and optimizer step are checked in this cell"
)


def test_losses_match_single_process(cell, lockstep, record_property):
    """Each rank's loss on its shard equals the single-process loss of that shard, every step: bit for
    bit where the forward is the single-process one; under tensor parallelism within the first-order
    bound of its linear layers summing in another order (suites/loss_rounding.py)."""
    records = lockstep
    steps = [step for record in records for step in record["steps"]]
    record_property("loss_max_abs", max(abs(step["loss"] - step["reference_loss"]) for step in steps))
    if forward_is_single_process(records):
        record_property("loss_max_ulp", max(step["loss_ulp"] for step in steps))
        allowed, expected = (lambda step: 0.0), "bit for bit: the same kernels on the same gathered parameters"
    else:
        record_property(
            "loss_max_ratio", max(abs(step["loss"] - step["reference_loss"]) / step["loss_bound"] for step in steps)
        )
        allowed = lambda step: step["loss_bound"]  # noqa: E731
        expected = "within the first-order bound of tensor parallelism's linear layers summing in another order"
    per_rank = [
        [
            f"step {index}: loss {step['loss']!r}, single-process {step['reference_loss']!r}: |diff| "
            f"{abs(step['loss'] - step['reference_loss']):.3e} ({step['loss_ulp']} ULP), allowed {allowed(step):.3e}"
            for index, step in enumerate(record["steps"])
            if abs(step["loss"] - step["reference_loss"]) > allowed(step)
        ]
        for record in records
    ]
    assert not any(per_rank), (
        f"{cell.id}: the parallel forward computes another loss than the single-process forward of the same shard "
        f"({expected}):\n"
        + collapsed(per_rank)
        + "\n  hint: parallelize changed the computation (a cast, another attention kernel, a tensor-parallel plan "
        "that drops a partial sum), or the gathered parameters differ from the reference's "
        "(see test_parameters_match_single_process_step)"
    )


def test_reduced_gradients_match_single_process(cell, lockstep, suite_options, record_property):
    """After the data-parallel reduction, the whole gradient equals the single-process mean gradient of
    the global batch within the derived reduction bound (bit for bit at two shards or fewer)."""
    records = lockstep
    reduction = MeanReduction(records[0]["shards"], suite_options.reduce_dtype)
    steps = records[0]["steps"]
    worst = max(step["gradient"]["max_abs"] for step in steps)
    record_property("grad_max_abs", worst)
    if not forward_is_single_process(records):
        pytest.skip(GRADIENTS_UNDER_TENSOR_PARALLELISM.format(worst=worst))
    record_property("precision", reduction.describe())
    if reduction.exact:
        record_property("grad_max_ulp", max(step["gradient"]["max_ulp"] for step in steps))
    else:
        record_property("grad_max_ratio", max(step["gradient"]["max_ratio"] for step in steps))
    problems = [f"step {index}: {line}" for index, step in enumerate(steps) for line in step["gradient"]["problems"]]
    if problems:
        raise AssertionError(
            f"{cell.id}: after the data-parallel reduction the gradient differs from the single-process mean gradient "
            f"of the same global batch by more than the reduction order allows ({reduction.describe()}):\n"
            + listing(problems)
            + "\n  hint: a reduction in a narrower dtype than declared ([suites.parallel_equivalence.options] reduce_dtype), "
            "a division by the wrong world size, or a reduction over the wrong ranks"
        )


def test_gradients_reduced_in_declared_dtype(cell, lockstep, suite_options):
    """No gradient after the reduction lies wholly on the grid of a dtype narrower than the declared
    one: its sum ran in that narrower dtype (the pytorch#190626 class), whatever the reduction order."""
    declared = suite_options.reduce_dtype
    if not NARROWER[declared]:
        pytest.skip(f"reduce_dtype = {declared!r}: no narrower dtype among {', '.join(REDUCE_DTYPES)} to tell apart")
    steps = lockstep[0]["steps"]
    if not any(step["grid_checked"] for step in steps):
        pytest.skip(
            f"no gradient had {GRID_EVIDENCE} nonzero elements: too few to tell an fp32 sum from a narrower one"
        )
    problems = [f"step {index}: {line}" for index, step in enumerate(steps) for line in step["narrow_grid"]]
    if problems:
        raise AssertionError(
            f"{cell.id}: gradients after the data-parallel reduction hold only values of a dtype narrower than the "
            f"declared reduce_dtype = {declared!r}, so they were summed in that dtype (an fp32 sum lands on bf16's grid "
            f"about once in 2**16 elements):\n"
            + listing(problems)
            + "\n  hint: a mixed-precision policy whose reduce_dtype is narrower than declared, or a reduction "
            "(a tensor-parallel all-reduce, say) that ignores it"
        )


def test_gradient_norm_is_the_whole_models(cell, lockstep, record_property):
    """On every rank, the norm the clip returns is the 2-norm of the whole gathered gradient, within
    the worst-case rounding of a norm of that many elements: not a shard's partial norm."""
    records = lockstep
    worst = max(step["norm"]["relative_error"] for record in records for step in record["steps"])
    record_property("norm_max_rel", worst)
    record_property("norm_tolerance_rel", records[0]["norm_tolerance"])
    per_rank = [
        [
            f"step {index}: clip_grad_norm returned {step['norm']['returned']!r}, the gathered gradient's norm is "
            f"{step['norm']['exact']!r} (single-process clip_grad_norm: {step['norm']['reference']!r}); "
            f"relative error {step['norm']['relative_error']:.3e}, tolerance {record['norm_tolerance']:.3e}"
            for index, step in enumerate(record["steps"])
            if step["norm"]["relative_error"] > record["norm_tolerance"]
        ]
        for record in records
    ]
    assert not any(per_rank), (
        f"{cell.id}: the gradient norm clip_grad_norm returns is not the norm of the whole model's gradient "
        f"(tolerance: the worst-case rounding of a 2-norm of {records[0]['elements']} elements):\n"
        + collapsed(per_rank)
        + "\n  hint: a norm over this rank's shards only (torch.nn.utils.clip_grad_norm_ on FSDP1, or over "
        "DTensor.to_local() grads) misses the other ranks' parts; reduce the squared norms across ranks first"
    )


def test_clipping_scales_by_the_whole_norm(cell, lockstep, record_property):
    """The clipped gradient is the gathered gradient times min(1, max_norm / (norm + 1e-6)) of the whole
    norm, within that norm's rounding bound; max_norm makes the first step clip."""
    records = lockstep
    steps = records[0]["steps"]
    record_property("clipped_steps", [index for index, step in enumerate(steps) if step["clip"]["coefficient"] < 1])
    record_property("clip_max_ratio", max(step["clip"]["max_ratio"] for step in steps))
    problems = [f"step {index}: {line}" for index, step in enumerate(steps) for line in step["clip"]["problems"]]
    if problems:
        raise AssertionError(
            f"{cell.id}: clipping did not scale the whole gradient by the coefficient of the whole norm "
            f"(max_norm {records[0]['max_norm']!r}; tolerance {records[0]['clip_tolerance']:.3e} x |g x coefficient|):\n"
            + listing(problems)
            + "\n  hint: each rank clipped by its own shard's norm, or the clip used another norm than the whole model's"
        )


def test_parameters_match_single_process_step(cell, lockstep):
    """Before training and after every step, the gathered parameters equal the single-process
    optimizer's step on the same clipped gradient, bit for bit."""
    records = lockstep
    per_rank = [record["initial_parameters"] for record in records]
    assert not any(per_rank), (
        f"{cell.id}: before any step, the parallel model's gathered parameters differ from the single-process "
        f"model built from the same seed:\n" + collapsed(per_rank) + "\n  hint: the model factory is not "
        "deterministic under torch.manual_seed, or parallelize changed the weights"
    )
    per_rank = [
        [f"after step {index}: {line}" for index, step in enumerate(record["steps"]) for line in step["parameters"]]
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


# ---- in the ranks ------------------------------------------------------------------------------


def train_in_lockstep(cell: dict, options: ParallelEquivalenceOptions, components: dict) -> dict:
    """Rank function: the cell's training and, on every rank, the single-process reference beside it;
    `{"unavailable": reason}` when the cell's optimizer implementation cannot be built here."""
    with deterministic_algorithms():
        try:
            lockstep = Lockstep(cell, options, components)
        except UnavailableImplementation as unavailable:
            return {"unavailable": str(unavailable)}
        return lockstep.run()


def reference_cell(cell: dict) -> dict:
    """The cell without parallelism: what `parallelize` wraps the single-process reference for (the model
    itself is built for the cell, as the parallel one is)."""
    return {**cell, "fsdp": "none", "mesh": "flat", "world_size": 1}


class Lockstep:
    """The cell's training beside its single-process reference: the same model from one seed, the same
    optimizer factory and implementation, one global batch per step, shard `data_parallel_rank` of it on this rank."""

    def __init__(self, cell: dict, options: ParallelEquivalenceOptions, components: dict):
        self.options = options
        self.cell = cell
        self.device = current_device()
        self.shards = data_parallel_size(cell)
        self.shard = data_parallel_rank(cell)
        self.make_batch = load(components["batch"])
        self.clip = load(components.get("clip_grad_norm", DEFAULT_CLIP))
        self.model = parallelized(components, self.seeded_model(cell, components), cell, device=self.device)
        plain = reference_cell(cell)
        built = self.seeded_model(cell, components)  # the cell's own model: a factory may size it by the cell
        names = module_names(built)  # before parallelize: a compiled block's names gain `_orig_mod.` there
        self.reference = remember_built(load(components["parallelize"])(built, plain, device=self.device), names)
        factory = load(components[f"optimizer_{cell['optimizer']}"])
        hyperparameters = dict(
            lr=options.lr,
            betas=(0.9, 0.95),
            eps=1e-8,
            weight_decay=options.weight_decay,
            implementation=implementation_of(cell),
        )
        self.optimizer = build_optimizer(factory, self.model, **hyperparameters)
        self.follower = build_optimizer(factory, self.reference, **hyperparameters)
        self.training = build_training_step(components, model=self.model, optimizer=self.optimizer, cell=cell)
        self.reference_training = build_training_step(
            components, model=self.reference, optimizer=self.follower, cell=plain
        )
        self.tensor_parallel = self.shards < (dist.get_world_size() if dist.is_initialized() else 1)
        self.max_norm: float | None = None

    def seeded_model(self, cell: dict, components: dict):
        torch.manual_seed(self.options.seed)
        return load(components["model"])(cell, dtype=torch.float32, dropout=0.0)

    def batch(self, model, step: int, shard: int):
        return self.make_batch(model, seed=self.options.batch_seed + step * self.shards + shard, device=self.device)

    def run(self) -> dict:
        initial = parameter_differences(full_parameters(self.model), self.reference_parameters())
        steps = []
        for step in range(self.options.steps):
            steps.append(self.step(step))
            if steps[-1]["parameters"]:
                break  # the reference no longer starts where the cell does: later steps would compare nothing
        elements = steps[0]["elements"] if steps else 0
        return {
            "shards": self.shards,
            "tensor_parallel": self.tensor_parallel,
            "initial_parameters": initial,
            "steps": steps,
            "elements": elements,
            "max_norm": self.max_norm,
            "norm_tolerance": norm_relative_bound(elements),
            "clip_tolerance": clip_relative_bound(elements),
        }

    def reference_parameters(self) -> dict[str, torch.Tensor]:
        return {name: param.detach().clone() for name, param in named_parameters_as_built(self.reference)}

    def reference_gradient(self, step: int) -> tuple[dict, dict, list, list]:
        """`reference_gradient_here` run on rank 0 alone and sent to every rank: every rank's reference
        is the same model fed the same batches and stepped with the same full gradients, so the others
        would compute the same bits, compiling and running the whole global batch again each."""
        mean, magnitude, losses, loss_bounds = from_rank_zero(
            lambda: on_device(self.reference_gradient_here(step), "cpu")
        )
        return on_device(mean, self.device), on_device(magnitude, self.device), losses, loss_bounds

    def reference_gradient_here(self, step: int) -> tuple[dict, dict, list, list]:
        """Single-process: every shard of the step's global batch, one after another; their mean
        gradient (summed in shard order, divided once), sum_d |g_d| in float64, their losses, and how
        far each loss may move to first order when the linear layers sum in another order."""
        total: dict[str, torch.Tensor] = {}
        magnitude: dict[str, torch.Tensor] = {}
        losses, loss_bounds = [], []
        for shard in range(self.shards):
            loss_bounds.append(self.loss_bound(step, shard) if self.tensor_parallel else 0.0)
            self.reference.zero_grad(set_to_none=True)
            loss = self.reference_training.loss(self.batch(self.reference, step, shard))
            self.reference_training.backward(loss)
            losses.append(loss.detach().float().cpu())
            for name, param in named_parameters_as_built(self.reference):
                if param.grad is not None:
                    gradient = param.grad.detach()
                    total[name] = total[name] + gradient if name in total else gradient.clone()
                    magnitude[name] = magnitude.get(name, 0) + gradient.double().abs()
        self.reference.zero_grad(set_to_none=True)
        return {name: value / self.shards for name, value in total.items()}, magnitude, losses, loss_bounds

    def loss_bound(self, step: int, shard: int) -> float:
        """How far the reference's loss on this shard may move to first order when its linear layers
        sum in another order, measured in a pass of its own, eager: the hooks that measure it are side
        effects that compiled (and checkpointed) blocks refuse to trace."""
        self.reference.zero_grad(set_to_none=True)
        with torch.compiler.set_stance("force_eager"), linear_rounding_bound(self.reference) as shares:
            loss = self.reference_training.loss(self.batch(self.reference, step, shard))
            self.reference_training.backward(loss)
        self.reference.zero_grad(set_to_none=True)
        return sum(shares)

    def reference_norm(self, mean: dict) -> float:
        """What the clip component returns for the single-process model holding the mean gradient."""
        for name, param in named_parameters_as_built(self.reference):
            param.grad = mean[name].clone() if name in mean else None
        returned = float(
            call_accepting(self.clip, self.reference, max_norm=self.max_norm, cell=reference_cell(self.cell))
        )
        self.reference.zero_grad(set_to_none=True)
        return returned

    def step(self, step: int) -> dict:
        mean, magnitude, reference_losses, loss_bounds = self.reference_gradient(step)
        if self.max_norm is None:
            self.max_norm = self.options.clip_fraction * exact_norm(mean)
        reference_norm = self.reference_norm(mean)

        self.model.train()
        loss = self.training.loss(self.batch(self.model, step, self.shard))
        self.training.backward(loss)
        reduced = full_gradients(self.model)
        returned_norm = float(scalar(call_accepting(self.clip, self.model, max_norm=self.max_norm, cell=self.cell)))
        clipped = full_gradients(self.model)
        self.training.optimizer_step()
        self.optimizer.zero_grad(set_to_none=True)
        parameters = full_parameters(self.model)

        for name, param in named_parameters_as_built(self.reference):
            param.grad = clipped[name].clone() if name in clipped else None
        self.reference_training.optimizer_step()
        self.follower.zero_grad(set_to_none=True)

        loss = loss.detach().float().cpu()
        reference_loss = reference_losses[self.shard]
        exact = exact_norm(reduced)
        elements = sum(gradient.numel() for gradient in reduced.values())
        coefficient = min(1.0, self.max_norm / (exact + CLIP_EPSILON))
        return {
            "loss": loss.item(),
            "reference_loss": reference_loss.item(),
            "loss_ulp": ulp_distance(loss, reference_loss),
            "loss_bound": loss_bounds[self.shard],
            "gradient": gradient_comparison(reduced, mean, magnitude, self.reduction()),
            "narrow_grid": narrow_grid_lines(reduced, self.options.reduce_dtype),
            "grid_checked": any(int(g.count_nonzero()) >= GRID_EVIDENCE for g in reduced.values()),
            "norm": {
                "returned": returned_norm,
                "exact": exact,
                "reference": reference_norm,
                "relative_error": abs(returned_norm - exact) / exact if exact else abs(returned_norm),
            },
            "clip": clip_comparison(reduced, clipped, coefficient, clip_relative_bound(elements)),
            "parameters": parameter_differences(parameters, self.reference_parameters()),
            "elements": elements,
        }

    def reduction(self) -> MeanReduction:
        return MeanReduction(self.shards, self.options.reduce_dtype)


def from_rank_zero(compute):
    """compute() on rank 0, its value broadcast to every rank of the default group; an exception there
    is raised on every rank (with rank 0's text), so none waits on a broadcast that never comes."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return compute()
    reply: list = [None]
    if dist.get_rank() == 0:
        try:
            reply = [("ok", compute())]
        except Exception as error:
            reply = [("error", f"{type(error).__name__}: {error}")]
            dist.broadcast_object_list(reply, src=0)
            raise
    dist.broadcast_object_list(reply, src=0)
    kind, value = reply[0]
    if kind == "error":
        raise RuntimeError(f"the single-process reference raised on rank 0, which computes it for every rank: {value}")
    return value


def scalar(norm) -> torch.Tensor:
    """The norm a clip returned as a plain tensor: a DTensor's full value (a collective), else itself."""
    return whole(norm) if isinstance(norm, torch.Tensor) else torch.tensor(norm)


def exact_norm(gradients: dict[str, torch.Tensor]) -> float:
    """The 2-norm of every element of every gradient, in float64 (the suite's stand-in for the exact norm)."""
    if not gradients:
        return 0.0
    return torch.linalg.vector_norm(torch.cat([g.detach().double().flatten().cpu() for g in gradients.values()])).item()


def gradient_comparison(parallel: dict, reference: dict, magnitude: dict, reduction: MeanReduction) -> dict:
    """Per gradient, whether the parallel one lies within the reduction bound of the reference's mean;
    the largest difference, ULP distance and difference-to-bound ratio over all of them."""
    problems = [
        f"{name}: no gradient in the parallel run, one in the single-process run"
        for name in sorted(reference.keys() - parallel.keys())
    ]
    problems += [
        f"{name}: a gradient in the parallel run, none in the single-process run"
        for name in sorted(parallel.keys() - reference.keys())
    ]
    if not reference:
        problems.append("the single-process run has no gradient: nothing to compare")
    max_abs, max_ulp, max_ratio = 0.0, 0, 0.0
    for name in sorted(parallel.keys() & reference.keys()):
        actual, expected = parallel[name].cpu(), reference[name].cpu()
        if actual.shape != expected.shape:
            problems.append(f"{name}: shape {tuple(actual.shape)}, single-process {tuple(expected.shape)}")
            continue
        difference = (actual.double() - expected.double()).abs()
        max_abs = max(max_abs, difference.max().item() if difference.numel() else 0.0)
        if reduction.exact:
            ulps = ulp_distance(actual, expected)
            max_ulp = max(max_ulp, ulps)
            if not bits_equal(actual, expected):
                problems.append(
                    f"{name}: {int((difference > 0).sum())}/{difference.numel()} elements differ, max |diff| "
                    f"{difference.max().item():.3e}, {ulps} ULP (bound: 0, bit for bit)"
                )
            continue
        bound = reduction.relative_bound * magnitude[name].cpu() / reduction.terms
        over = difference > bound
        ratio = difference / bound.clamp_min(torch.finfo(torch.float64).tiny)
        max_ratio = max(max_ratio, ratio.max().item() if ratio.numel() else 0.0)
        if over.any():
            worst = int(ratio.flatten().argmax())
            problems.append(
                f"{name}: {int(over.sum())}/{over.numel()} elements over the bound; worst |diff| "
                f"{difference.flatten()[worst].item():.3e} where the bound is {bound.flatten()[worst].item():.3e} "
                f"({ratio.flatten()[worst].item():.3g}x)"
            )
    return {"problems": problems, "max_abs": max_abs, "max_ulp": max_ulp, "max_ratio": max_ratio}


def narrow_grid_lines(gradients: dict, declared: str) -> list[str]:
    """One line per gradient whose nonzero elements (at least GRID_EVIDENCE of them) all lie on the grid
    of a dtype narrower than `declared`: values only a sum in that dtype produces."""
    lines = []
    for name in sorted(gradients):
        gradient = gradients[name].cpu()
        nonzero = gradient[gradient != 0]
        if nonzero.numel() < GRID_EVIDENCE:
            continue
        for narrow in NARROWER[declared]:
            if torch.equal(nonzero.to(getattr(torch, narrow)).to(nonzero.dtype), nonzero):
                lines.append(f"{name}: all {nonzero.numel()} nonzero elements lie on the {narrow} grid")
                break
    return lines


def clip_comparison(reduced: dict, clipped: dict, coefficient: float, relative_bound: float) -> dict:
    """Per gradient, whether the clipped one equals the reduced one times `coefficient` within the
    relative bound; the largest difference-to-bound ratio."""
    problems = [f"{name}: the clip dropped this gradient" for name in sorted(reduced.keys() - clipped.keys())]
    max_ratio = 0.0
    for name in sorted(reduced.keys() & clipped.keys()):
        expected = reduced[name].cpu().double() * coefficient
        difference = (clipped[name].cpu().double() - expected).abs()
        bound = relative_bound * expected.abs()
        ratio = difference / bound.clamp_min(torch.finfo(torch.float64).tiny)
        max_ratio = max(max_ratio, ratio.max().item() if ratio.numel() else 0.0)
        over = difference > bound
        if over.any():
            worst = int(ratio.flatten().argmax())
            actual = clipped[name].cpu().double().flatten()[worst].item()
            unclipped = reduced[name].cpu().double().flatten()[worst].item()
            problems.append(
                f"{name}: {int(over.sum())}/{over.numel()} elements off; e.g. {unclipped:.6e} clipped to {actual:.6e} "
                f"(x{actual / unclipped if unclipped else float('nan'):.6f}), expected x{coefficient:.6f}"
            )
    return {"problems": problems, "coefficient": coefficient, "max_ratio": max_ratio}


def parameter_differences(parallel: dict, reference: dict) -> list[str]:
    """Per parameter: missing on one side, or not bit-identical (how many elements, by how much)."""
    if not reference:
        return ["the single-process model has no parameters: nothing to compare"]
    problems = [f"{name}: only in the single-process model" for name in sorted(reference.keys() - parallel.keys())]
    problems += [f"{name}: only in the parallel model" for name in sorted(parallel.keys() - reference.keys())]
    for name in sorted(parallel.keys() & reference.keys()):
        actual, expected = parallel[name].cpu(), reference[name].cpu()
        if actual.shape != expected.shape or actual.dtype != expected.dtype:
            problems.append(
                f"{name}: {actual.dtype} {tuple(actual.shape)}, single-process {expected.dtype} {tuple(expected.shape)}"
            )
        elif not bits_equal(actual, expected):
            difference = (actual.double() - expected.double()).abs()
            problems.append(
                f"{name}: {int((difference > 0).sum())}/{difference.numel()} elements differ, max |diff| "
                f"{difference.max().item():.3e}, {ulp_distance(actual, expected)} ULP"
            )
    return problems
