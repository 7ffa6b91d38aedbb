"""DTensor optimizer state: laid out like its param, saved as one chunk per rank, exact after a reshard load.

- The bug (../shared/seeds/dtensor-optimizer-state.txt): TransformerEngine's FusedAdam turned the
  state of DTensor params into plain local tensors, so DCP saved each shard as the whole tensor.
- Every check runs on the `model` component and on a probe whose first dims (7, 11) split unevenly
  over 2 and 4 ranks (a state wrapped without its global shape is wrong only there); `on_rank_*`
  functions run in every rank process.
- Quantized state is laid out as the DTensor that wraps it and compared, after a reshard, through
  the optimizer's state adapter (suites/optimizer_state.py), bit for bit (suites/ulp.py).
- `layout_source`: the DCP checkpoint the `checkpointer` component writes (found by its `.metadata`,
  each state under whatever prefix), else torch's `get_optimizer_state_dict` saved with `dcp.save`.
- `reshard_worlds`: each side of a reshard on sub-worlds of the cell's ranks where `parallelize` takes
  `mesh` and a bound checkpointer `process_group` or `mesh` (cheaper), else in a world of its own, a
  rank pool of that side's size (`ranks.in_world`) whose default group is exactly that world.
- `reshard_source`: the checkpointer's own `save(step)` and `load()` in worlds of their own, or in
  sub-worlds where the bound form takes a `process_group` or `mesh` (suites/checkpointer_forms.py),
  else torch's helpers and DCP.
- `reshard_continued`: after the load, CONTINUED_STEPS steps against the run that never stopped,
  replayed at the load's world size from the save's seed (its step before the save takes the same
  batch on every rank, so its mean gradient is the same at any world size): bit for bit, or not
  compared, saying why, where the replay does not reach the saved state bit for bit.
- The sharded-save check says apart whether the state is stored sharded and whether it is keyed by
  name or by position (suites/dcp_layout.py). No param-shaped state skips; some params without fails.
- Options: `DtensorOptimOptions` (torchmatrix/matrix/suite_options.py).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from torchmatrix.testing import (
    DEFAULT_IMPLEMENTATION,
    DtensorOptimOptions,
    UnavailableImplementation,
    accepts,
    build_optimizer,
    cell_layout,
    cell_mesh,
    current_device,
    data_parallel_rank,
    implementation_of,
    is_bound_checkpointer,
    load,
    mesh_group,
    state_dict_root,
    user_model,
)

from .built_names import named_parameters_as_built
from .checkpointer_forms import RunCheckpointer, reshards_itself
from .dcp_layout import ExpectedState, find_checkpoint, read_layouts, storage_findings
from .mesh_placements import TensorParallelPlan, placement_problems
from .model_output import call_model, loss_of
from .optimizer_state import inner_optimizers, optimizer_state_of, param_groups_of, quantized_state_kinds, state_adapter
from .parallelize_component import parallelized
from .scheduler_component import build_scheduler
from .training_step import build_training_step
from .ulp import bits_difference, bits_equal

OPTIONS = DtensorOptimOptions  # the dataclass `suite_options` arrives as

LR = 1e-2
SAVE_SEED, LOAD_SEED = 0, 1
MODEL_KINDS = ("model", "uneven_probe")
RESHARDS = ("shrink", "grow")  # W -> W/2 and W/2 -> W for a cell of W ranks: 2->1, 1->2, 4->2, 2->4, ...
FLAT = "flat"
FULL = StateDictOptions(full_state_dict=True)
TORCH_HELPERS = "torch get_optimizer_state_dict + dcp.save"
RESHARD_THROUGH_CHECKPOINTER = "checkpointer"
RESHARD_THROUGH_TORCH = (
    "torch get/set_model_state_dict and get/set_optimizer_state_dict + dcp.save/load over a process group ({why})"
)
SUB_WORLDS = "sub-worlds of the cell's ranks (the first N of them on a group of their own)"
OWN_WORLDS = "worlds of their own, a rank pool of each side's size whose default group is that world ({why})"
CONTINUE_SEEDS = (10, 20)
CONTINUED_STEPS = len(CONTINUE_SEEDS)
SUB_WORLD_MESHES: dict[int, DeviceMesh | None] = {}


# ---- main process: which cells and components this suite can check --------------------------


@pytest.fixture(autouse=True)
def sharded_params(cell):
    """Skip cells without a data-parallel wrapper: their params and state are plain tensors."""
    if cell["fsdp"] == "none":
        pytest.skip("fsdp=none: params are plain tensors, so there is no sharded optimizer state to check")


@pytest.fixture(autouse=True)
def optimizer_implementation_builds(cell, ranks, recipe, once_per_cell):
    """Skip a cell whose optimizer factory says it cannot build the cell's `optimizer_impl` here
    (UnavailableImplementation: fused kernels this torch lacks, say), asked once per cell on the
    ranks, with the cell's own params. Anything else the build raises fails the tests that build."""
    if implementation_of(cell) == DEFAULT_IMPLEMENTATION:
        return
    reason = once_per_cell("the optimizer implementation check", lambda: ranks.run(on_rank_unavailable, recipe)[0])
    if reason:
        pytest.skip(reason)


@pytest.fixture(params=MODEL_KINDS)
def model_kind(request) -> str:
    """The `model` component, or the suite's own probe with uneven shards."""
    return request.param


@pytest.fixture
def recipe(cell, components, suite_options, model_kind) -> Recipe:
    """What every rank needs to build the stack (the plugin has already skipped cells whose
    optimizer needs a package that is not installed, such as TransformerEngine on a CPU box).

    Option `bf16_param_optimizers` names the optimizer values that get bf16 params, as a
    mixed-precision stack gives its precision-aware optimizer; the others get fp32 params. Option
    `tensor_parallel_plan` ({colwise = [...], rowwise = [...]}, module names) is the plan that
    `parallelize` applies on a mesh with a tp dim; by default the reference decoder's."""
    bf16 = cell["optimizer"] in suite_options.bf16_param_optimizers
    plan = TensorParallelPlan.from_option(suite_options.tensor_parallel_plan)
    return Recipe(dict(components), cell, model_kind, "bfloat16" if bf16 else "float32", plan)


def _merged(per_rank: list[list[str]]) -> list[str]:
    return [f"rank {rank}: {line}" for rank, lines in enumerate(per_rank) if lines for line in lines]


def _merged_alike(per_rank: list[list[str]]) -> list[str]:
    """Each line once, with the ranks that reported it (a layout is usually wrong alike on every rank)."""
    ranks_of: dict[str, list[int]] = {}
    for rank, lines in enumerate(per_rank):
        for line in lines:
            ranks_of.setdefault(line, []).append(rank)
    return [
        f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {line}" for line, ranks in ranks_of.items()
    ]


# ---- the tests -------------------------------------------------------------------------------


def test_state_is_laid_out_like_its_param(cell, ranks, recipe):
    """After a step, every non-scalar state of a DTensor param is a DTensor with the param's
    mesh, placements, global shape and stride, and a local shard of the param's local shape; on a
    2-D mesh every param is first placed as the mesh says on each of its dims (suites/mesh_placements.py)."""
    if cell["fsdp"] != "fsdp2":
        pytest.skip(
            f"fsdp={cell['fsdp']}: params are flat-parameter views, not DTensors; test_saved_state_is_sharded covers this cell"
        )
    results = ranks.run(on_rank_state_layout, recipe)
    layout = cell_layout(cell)
    misplaced = _merged_alike([r["placement_problems"] for r in results])
    if misplaced:
        raise AssertionError(
            f"parameters placed otherwise than the {layout.kind} mesh {dict(zip(layout.dim_names, layout.shape))} says "
            f"(dp_replicate: Replicate, dp_shard: Shard, tp: the plan's Shard(0) colwise / Shard(1) rowwise, else Replicate), "
            f"so their optimizer state is too:\n"
            + "\n".join(misplaced)
            + "\nfix the plan or mesh in `parallelize`, or set [suites.dtensor_optim.options] tensor_parallel_plan to the plan it applies"
        )
    assert not (problems := _merged([r["problems"] for r in results])), "\n".join(problems)
    if not any(r["param_shaped_states"] for r in results):
        pytest.skip(no_param_shaped_state(recipe))
    if ranks.world_size > 1:
        uneven = results[0]["uneven_params"]
        assert recipe.model_kind == "model" or uneven, (
            f"the uneven probe has no param split unevenly over {ranks.world_size} ranks"
        )


def test_saved_state_is_sharded(cell, ranks, recipe, tmp_path, record_property):
    """DCP's metadata shows every param-shaped state stored once, one chunk per rank, at the
    param's global shape: not a single rank's shard posing as the whole tensor. The checkpoint is
    the one the `checkpointer` component writes, when there is one (see `layout_source`)."""
    results = ranks.run(on_rank_save, recipe, str(tmp_path / "sharded-save"))
    record_property("layout_source", results[0]["layout_source"])
    print(f"layout_source: {results[0]['layout_source']}")
    assert not (errors := _merged([r["errors"] for r in results])), "\n".join(errors)
    if not any(r["param_shaped_states"] for r in results):
        pytest.skip(no_param_shaped_state(recipe))
    param_chunks = param_chunks_of_every_rank([r["param_chunks"] for r in results])
    expected = [
        ExpectedState(name, position, tuple(shape), param_chunks.get(name))
        for name, position, shape in results[0]["expected"]
    ]
    findings = storage_findings(read_layouts(results[0]["checkpoint"]), expected, ranks.world_size)
    print("\n".join(findings.lines))
    record_property("sharded_states", len(expected))
    record_property("sharded_stored_bytes", findings.stored_bytes)
    record_property("sharded_full_copy_bytes", findings.full_copy_bytes)
    record_property("state_layout", " | ".join(findings.lines))
    assert expected, "the optimizer keeps param-shaped state, yet torch's get_optimizer_state_dict lists none"
    source = results[0]["layout_source"]
    failures = []
    if findings.unfound:
        failures.append(
            f"{len(findings.unfound)} of {len(expected)} param-shaped states could not be looked up in the checkpoint "
            f"(written by {source}) by parameter name, position or a tail of the name: a naming problem, not a layout "
            "fault (names are read through the wrappers of the model `parallelize` returned):\n"
            + "\n".join(findings.unfound)
        )
    if findings.problems:
        failures.append(
            f"{len(findings.problems)} of {len(expected)} param-shaped states are not stored sharded "
            f"(checkpoint written by {source}):\n" + "\n".join(findings.problems)
        )
    assert not failures, "\n".join(failures + findings.lines)


@pytest.mark.parametrize("reshard", RESHARDS)
def test_reshard_load_is_exact(cell, ranks, recipe, reshard, tmp_path, record_property):
    """Save model and optimizer at one world size, load them into a fresh stack built from
    another seed at another world size: every full tensor is identical; then a few steps train
    there and equal, bit for bit, the run that never stopped continued at that world size, and
    keep DTensor state laid out like its param.

    A cell of W ranks reshards between W (on the cell's mesh) and W/2 (1-D), so each pair runs in
    the cells as wide as its larger side and no two cells repeat one. A cell on a 2-D mesh also
    reshards between that mesh and the 1-D mesh over the same W ranks (save at 2 x 2, load at 4;
    save at 4, load at 2 x 2), the move a training makes when it adds or drops TP or HSDP.

    Each side runs in sub-worlds of the cell's ranks where the stack's components take the suite's
    `mesh` and process group, else in a world of its own of that side's size (`reshard_worlds`)."""
    if ranks.world_size < 2:
        pytest.skip("a reshard needs at least 2 ranks; this cell has 1")
    kind = cell_layout(cell).kind
    whole = World(ranks.world_size, kind)
    others = [World(ranks.world_size // 2, FLAT)] + ([World(ranks.world_size, FLAT)] if kind != FLAT else [])
    pairs = [(whole, other) if reshard == "shrink" else (other, whole) for other in others]
    own_worlds = own_worlds_needed(recipe)
    worlds = OWN_WORLDS.format(why=own_worlds) if own_worlds else SUB_WORLDS
    record_property("reshards", ", ".join(f"{src}->{dst}" for src, dst in pairs))
    record_property("reshard_source", reshard_source(recipe, own_worlds is not None))
    record_property("reshard_worlds", worlds)
    print(f"reshard_worlds: {worlds}")
    reports = []
    try:
        for src, dst in pairs:
            reports.append(check_reshard(ranks, recipe, src, dst, tmp_path, own_worlds is not None))
    finally:
        record_property("reshard_tensors_compared", sum(report["compared"] for report in reports))
        if reports:
            continued = " | ".join(f"{src}->{dst}: {report['continued']}" for (src, dst), report in zip(pairs, reports))
            record_property("reshard_continued", continued)
            print(f"reshard_continued: {continued}")
    if not any(report["optimizer_compared"] for report in reports):
        pytest.skip(f"model tensors resharded exactly; {no_param_shaped_state(recipe)}")


def own_worlds_needed(recipe: Recipe) -> str | None:
    """Why each side of the reshard needs a world of its own (a rank pool of that side's size, whose
    default group is that world), or None where sub-worlds of the cell's ranks serve: cheaper, no
    other ranks start. The stack's `parallelize` must take the suite's `mesh`, and a checkpoint
    manager (the bound form) its `process_group` or `mesh`, else they build or save over the whole
    default group."""
    parallelize = recipe.components["parallelize"]
    if not accepts(load(parallelize), "mesh"):
        return f"{parallelize} takes no `mesh`, so it builds its mesh over the whole default group"
    name = recipe.components.get("checkpointer")
    if name and is_bound_checkpointer(load(name)) and not reshards_itself(load(name)):
        return f"checkpointer {name} takes no process_group or mesh, so it saves and loads over the whole default group"
    return None


def check_reshard(ranks, recipe: Recipe, src: World, dst: World, tmp_path: Path, own_worlds: bool) -> dict:
    """Save in world `src`, load into a fresh stack in world `dst`, train on, fail on any difference;
    rank 0's report. `own_worlds`: each side on a rank pool of its own size, else both on the cell's."""
    checkpoint_dir = tmp_path / f"reshard-{src.slug}-to-{dst.slug}"
    where = f"reshard {src}->{dst}{' (each side in a world of its own)' if own_worlds else ''}"
    try:
        results, crash = reshard_on_ranks(ranks, recipe, str(checkpoint_dir), src, dst, own_worlds), None
    except Exception as error:
        results, crash = [], error
    if crash is not None:
        layout = layout_lines_written(checkpoint_dir)
        if not layout:
            raise crash
        pytest.fail(
            f"{where}: state laid out unlike its param right after load, before anything gathered it:\n"
            + "\n".join(layout)
            + f"\nthen the run crashed (what a gather of such state does): {crash}",
            pytrace=False,
        )
    layout = _merged([r["layout_after_load"] for r in results])
    errors = _merged([r["errors"] for r in results])
    assert not layout + errors, (
        f"{where}: "
        + (
            "state laid out unlike its param right after load, before anything gathered it:\n"
            + "".join(f"{line}\n" for line in layout)
            if layout
            else ""
        )
        + ("failed:\n" + "\n".join(errors) if errors else "")
    )
    report = results[0]
    assert report["compared"], f"{where}: nothing was compared: the saved state is empty"
    mismatches = report["mismatches"]
    if mismatches:
        raise AssertionError(
            f"{where}: {len(mismatches)} of {report['compared']} tensors differ after load:\n" + "\n".join(mismatches)
        )
    problems = _merged([r["problems"] for r in results])
    if problems:
        raise AssertionError(f"{where}, after a step at {dst} ranks:\n" + "\n".join(problems))
    losses = _merged([r["losses_diverged"] for r in results]) if report.get("continued_compared") else []
    diverged = losses + report["continued_mismatches"]
    if diverged:
        raise AssertionError(
            f"{where}: training after the load differs from the run that never stopped, continued at {dst} ranks "
            f"({CONTINUED_STEPS} steps from the same state and batches, compared bit for bit):\n" + "\n".join(diverged)
        )
    return report


def reshard_on_ranks(
    ranks, recipe: Recipe, checkpoint_dir: str, src: World, dst: World, own_worlds: bool
) -> list[dict]:
    """Every rank's result of the reshard: both sides on the cell's ranks, or each side on a world of
    its own (the save's errors, when it failed there, as the result)."""
    if not own_worlds:
        return ranks.run(on_rank_reshard, recipe, checkpoint_dir, src, dst)
    saved = ranks.in_world(src.size).run(on_rank_save_in_own_world, recipe, checkpoint_dir, src)
    if any(saved):
        return [side_result(errors) for errors in saved]
    return ranks.in_world(dst.size).run(on_rank_load_in_own_world, recipe, checkpoint_dir, src, dst)


def reshard_source(recipe: Recipe, own_worlds: bool) -> str:
    """What the reshard saved and loaded with: the user's checkpointer where it can, else torch's helpers and why."""
    if recipe.reshards_through_checkpointer(own_worlds):
        return RESHARD_THROUGH_CHECKPOINTER
    name = recipe.components.get("checkpointer")
    why = (
        f"checkpointer {name} takes no process_group or mesh, so it cannot save or load in a smaller world"
        if name
        else "no checkpointer in [components]"
    )
    return RESHARD_THROUGH_TORCH.format(why=why)


def no_param_shaped_state(recipe: Recipe) -> str:
    optimizer = recipe.components[f"optimizer_{recipe.cell['optimizer']}"]
    return (
        f"the optimizer ({optimizer}) keeps no param-shaped state after a step (none, or only scalars): "
        f"no state layout to check"
    )


# ---- rank side: building the stack ------------------------------------------------------------


class World(NamedTuple):
    """The first `size` ranks sharding over the mesh `kind` names (a 2-D one spans every rank)."""

    size: int
    kind: str

    @property
    def cell(self) -> dict:
        """A cell of this world's size and mesh, for torchmatrix.testing's mesh functions."""
        return {"mesh": self.kind, "world_size": self.size}

    @property
    def slug(self) -> str:
        return f"{self.size}{self.kind}"

    def of(self, cell) -> dict:
        """`cell` with this world's size and mesh: what a stack builds from in a world of its own."""
        return {**cell, **self.cell}

    def __str__(self) -> str:
        if self.kind == FLAT:
            return str(self.size)
        return f"{'x'.join(map(str, cell_layout(self.cell).shape))} {self.kind}"


def world_mesh(world: World) -> DeviceMesh | None:
    """This rank's mesh of `world`, None where the rank is outside it. Building one creates process
    groups, a collective: every rank asks for every world a test uses before any of them trains."""
    if world.size == dist.get_world_size():
        return cell_mesh(world.cell)
    return sub_world_meshes()[world.size]


class Recipe(NamedTuple):
    """Picklable instructions for building the stack under test in a rank process."""

    components: dict
    cell: object
    model_kind: str
    param_dtype: str
    tensor_parallel_plan: TensorParallelPlan

    def build(self, seed: int, mesh: DeviceMesh | None = None, cell=None) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Model (from `seed`) built for `cell` (the recipe's when None) and wrapped by the
        `parallelize` component over `mesh` (the cell's when None), and the cell's optimizer component
        over its params. The uneven probe is not the stack's model, so it is never compiled (it has no
        block for `compile_nesting` to enter)."""
        device = current_device()
        dtype = getattr(torch, self.param_dtype)
        build_model = load(self.components["model"]) if self.model_kind == "model" else build_uneven_probe
        cell = cell or self.cell
        cell = cell if self.model_kind == "model" else {**cell, "compile": "none"}
        torch.manual_seed(seed)
        model = build_model(cell, dtype=dtype)
        model = parallelized(self.components, model, cell, device=device, mesh=mesh)
        factory = load(self.components[f"optimizer_{self.cell['optimizer']}"])
        return model, build_optimizer(factory, model, lr=LR, implementation=implementation_of(self.cell))

    def reshards_through_checkpointer(self, own_worlds: bool) -> bool:
        """Whether the `checkpointer` component does the reshard: any one in worlds of their own (its
        default group is the world), only one that takes a process group or mesh in sub-worlds."""
        if "checkpointer" not in self.components:
            return False
        return own_worlds or reshards_itself(load(self.components["checkpointer"]))

    def checkpointer(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        directory: str,
        mesh: DeviceMesh | None = None,
        cell=None,
    ) -> RunCheckpointer:
        """The `checkpointer` component over this stack, in whichever form it has, saving and loading
        over `mesh` (None: `cell`'s, the recipe's when None, over every rank), with the `scheduler`
        component and a loader that never moves."""
        scheduler = build_scheduler(self.components, optimizer, warmup_steps=1, total_steps=2, cell=self.cell)
        return RunCheckpointer(
            load(self.components["checkpointer"]),
            directory,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            loader=IdleLoader(),
            process_group=mesh_group(mesh) if mesh is not None else None,
            mesh=mesh,
            cell=cell or self.cell,
        )

    def plain_state(self, state: dict) -> dict:
        """One param's optimizer state made plain by the cell's optimizer's state adapter."""
        return state_adapter(self.components, self.cell["optimizer"])(state)

    def train_step(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        seed: int,
        world: World | None = None,
        *,
        alike: bool = False,
    ) -> torch.Tensor:
        """One step on this rank's batch, and its loss: one batch per data-parallel rank of `world` (the
        cell's when None), or, `alike`, the same batch on every rank, a step whose mean gradient is the
        same at any world size; through the stack's `training_step` component. The probe model's loss is
        read from its output, as the stack's loss function is written for the stack's model."""
        make_batch = load(self.components["batch"]) if self.model_kind == "model" else make_probe_batch
        rank = 0 if alike else data_parallel_rank(self.cell if world is None else world.cell)
        batch = make_batch(user_model(model), seed=seed + rank, device=current_device())
        step = build_training_step(self.components, model=model, optimizer=optimizer, cell=self.cell)
        loss = step.loss(batch) if self.model_kind == "model" else loss_of(call_model(model, batch))
        step.backward(loss)
        step.optimizer_step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach().to("cpu", copy=True)

    def train_on(self, model: nn.Module, optimizer: torch.optim.Optimizer, world: World) -> list[torch.Tensor]:
        """CONTINUED_STEPS steps in `world` after a load (or where a never-stopped run stands then), each
        from the same global RNG state whatever ran before; this rank's losses."""
        losses = []
        for seed in CONTINUE_SEEDS:
            torch.manual_seed(seed + dist.get_rank())
            losses.append(self.train_step(model, optimizer, seed, world))
        return losses


class ProbeBlock(nn.Module):
    """One sharding unit of the probe: a linear map whose output dim is its weight's first dim."""

    def __init__(self, width_in: int, width_out: int):
        super().__init__()
        self.checkpointing = False
        self.proj = nn.Linear(width_in, width_out)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(hidden))


class ProbeOutput(NamedTuple):
    loss: torch.Tensor


class UnevenProbe(nn.Module):
    """8 -> 7 -> 11 -> 8: weights [7, 8], [11, 7] and biases [7], [11] split unevenly over 2
    and 4 ranks, yet every rank holds a piece (a first dim of 5 or 6 would leave a rank of 4
    empty, which FSDP1 checkpoints cannot load in torch 2.13); offers `decoder_layers()` as
    the `parallelize` component expects."""

    WIDTHS = (8, 7, 11)

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(ProbeBlock(a, b) for a, b in zip(self.WIDTHS, self.WIDTHS[1:]))
        self.head = nn.Linear(self.WIDTHS[-1], self.WIDTHS[0])

    def decoder_layers(self) -> list[nn.Module]:
        return list(self.blocks)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> ProbeOutput:
        hidden = inputs
        for block in self.blocks:
            hidden = block(hidden)
        return ProbeOutput(nn.functional.mse_loss(self.head(hidden).float(), targets))


def build_uneven_probe(cell, *, dtype: torch.dtype) -> UnevenProbe:
    return UnevenProbe().to(dtype)


def make_probe_batch(model: UnevenProbe, *, seed: int, device: torch.device) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(4, UnevenProbe.WIDTHS[0], generator=generator)
    dtype = next(model.parameters()).dtype
    return {"inputs": inputs.to(device, dtype), "targets": inputs.flip(-1).to(device)}


def sub_world_meshes() -> dict[int, DeviceMesh | None]:
    """size -> mesh over ranks 0..size-1 for every world smaller than the cell's (None where
    this rank is outside it); the cell's own world is torchmatrix.testing.cell_mesh's.

    Created once per rank process, by every rank in the same order (new_group is collective
    and names groups by creation order), and kept: a group destroyed and created again under
    the same name would rendezvous on the previous one's stale store keys."""
    if not SUB_WORLD_MESHES:
        for size in range(1, dist.get_world_size()):
            group = dist.new_group(list(range(size)))
            inside = dist.get_rank() < size
            SUB_WORLD_MESHES[size] = DeviceMesh.from_group(group, current_device().type) if inside else None
    return SUB_WORLD_MESHES


def attempt(errors: list[str], phase: str, fn, *args, **kwargs):
    """fn(*args), or None with the error recorded in `errors`. DCP fails on every rank of its
    group together (with a CheckpointException, which is not an Exception), so recording
    instead of raising keeps the ranks in step and the rank pool alive, and the test reports
    what went wrong in one line."""
    try:
        return fn(*args, **kwargs)
    except (Exception, CheckpointException) as error:
        last_line = (str(error).strip().splitlines() or [""])[-1]
        errors.append(f"{phase}: {type(error).__name__}: {last_line}")
        return None


# ---- rank side: the checks --------------------------------------------------------------------


def layout_problems(model: nn.Module, optimizer: torch.optim.Optimizer, *, dtensors_expected: bool) -> list[str]:
    """Every way a non-scalar state of a DTensor param differs in layout from the param; where
    params should be DTensors (FSDP2) and none is, that the check would compare nothing."""
    names = {param: name for name, param in named_parameters_as_built(model)}
    if dtensors_expected and not any(isinstance(p, DTensor) for p in names):
        return [
            f"no parameter of {type(model).__name__} is a DTensor after `parallelize` under FSDP2: there is no state layout to check"
        ]
    states = optimizer_state_of(optimizer)
    keeps_state = any(states.values())
    problems = [
        f"{names[p]}: no optimizer state after a step, while other params have some"
        for p in names
        if keeps_state and isinstance(p, DTensor) and not states.get(p)
    ]
    for param, state in states.items():
        if not isinstance(param, DTensor):
            continue
        for key, value in state.items():
            if not torch.is_tensor(value) or value.dim() == 0:
                continue
            where = f"state {key!r} of {names.get(param, '?')} (param {list(param.shape)} {param.placements})"
            if not isinstance(value, DTensor):
                problems.append(f"{where} is a plain {type(value).__name__} of shape {list(value.shape)}")
                continue
            for aspect, got, wanted in (
                ("mesh", value.device_mesh, param.device_mesh),
                ("placements", value.placements, param.placements),
                ("global shape", value.shape, param.shape),
                ("global stride", value.stride(), param.stride()),
                ("local shape", value.to_local().shape, param.to_local().shape),
            ):
                if got != wanted:
                    problems.append(f"{where} has {aspect} {got}, expected {wanted}")
    return problems


def on_rank_unavailable(recipe: Recipe) -> str | None:
    """Why the optimizer factory cannot build the cell's implementation here, or None when it can."""
    try:
        recipe.build(SAVE_SEED)
    except UnavailableImplementation as unavailable:
        return str(unavailable)
    return None


def on_rank_state_layout(recipe: Recipe) -> dict:
    model, optimizer = recipe.build(SAVE_SEED)
    recipe.train_step(model, optimizer, SAVE_SEED)
    uneven = [name for name, p in named_parameters_as_built(model) if p.dim() and p.shape[0] % dist.get_world_size()]
    return {
        "placement_problems": placement_problems(
            model, recipe.cell, recipe.tensor_parallel_plan, plan_applies=recipe.model_kind == "model"
        ),
        "problems": layout_problems(model, optimizer, dtensors_expected=True),
        "uneven_params": uneven,
        "param_shaped_states": param_shaped_states(optimizer),
    }


def param_shaped_states(optimizer: torch.optim.Optimizer) -> int:
    """How many non-scalar tensors the optimizer keeps in its per-param state on this rank."""
    return sum(
        torch.is_tensor(v) and v.dim() > 0 for state in optimizer_state_of(optimizer).values() for v in state.values()
    )


class IdleLoader:
    """The `loader` a checkpointer's save receives here: a position that never moves, since
    dtensor_optim reads no batch through it."""

    def state_dict(self) -> dict:
        return {"position": 0}

    def load_state_dict(self, state: dict) -> None:
        pass


def on_rank_save(recipe: Recipe, checkpoint_dir: str) -> dict:
    """Take a step and save: through `checkpointer().save` when there is a checkpointer component
    and it writes DCP metadata, else the optimizer state from torch's helpers with `dcp.save`.
    Returns the folder to read, what wrote it, and per non-scalar state its key ("<param>.<state>")
    and the param's global shape (what the main process expects to find sharded)."""
    model, optimizer = recipe.build(SAVE_SEED)
    recipe.train_step(model, optimizer, SAVE_SEED)
    expected = sharded_states_expected(model, optimizer)
    errors, checkpoint, source = [], None, f"{TORCH_HELPERS} (no checkpointer in [components])"
    if "checkpointer" in recipe.components:
        name = recipe.components["checkpointer"]
        attempt(errors, f"checkpointer ({name}).save", recipe.checkpointer(model, optimizer, checkpoint_dir).save, 1)
        checkpoint = checkpoint_rank0_sees(checkpoint_dir)
        if errors:
            source = f"checkpointer {name} (its save failed)"
        elif checkpoint:
            source = f"checkpointer {name} (the DCP checkpoint its save wrote)"
        else:
            source = f"{TORCH_HELPERS} (checkpointer {name} wrote no single DCP .metadata under the directory)"
    if checkpoint is None and not errors:
        checkpoint = f"{checkpoint_dir}-torch-helpers"
        state = get_optimizer_state_dict(state_dict_root(model), inner_optimizers(optimizer))
        attempt(errors, "dcp.save", dcp.save, {"optimizer": state}, checkpoint_id=checkpoint)
    return {
        "errors": errors,
        "expected": expected,
        "param_chunks": param_chunks(model, optimizer),
        "checkpoint": str(checkpoint),
        "layout_source": source,
        "param_shaped_states": param_shaped_states(optimizer),
    }


def sharded_states_expected(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[tuple]:
    """Per non-scalar optimizer state, (its key `<param fqn>.<state>`, its key by position
    `state.<index>.<state>` or None, its param's global shape). Under FSDP2 the state is keyed by
    the DTensor params themselves, so their names, positions in the optimizer's param order and
    shapes come from the model and optimizer, not from torch's state-dict helpers, which a
    checkpointer of the user's may not go through (they cannot resolve torchtitan's fused-QKV keys);
    FSDP1 keeps state per flat parameter, which only the helpers unflatten to names (positions then
    number flat parameters, so none is given)."""
    states = optimizer_state_of(optimizer)
    if any(isinstance(param, DTensor) for param in states):
        names = {param: name for name, param in named_parameters_as_built(model)}
        order = [param for group in param_groups_of(optimizer) for param in group["params"]]
        positions = {param: index for index, param in enumerate(order)}
        per_param = {
            names[param]: (tuple(param.size()), positions.get(param), entries) for param, entries in states.items()
        }
    else:
        root = state_dict_root(model)
        shapes = {name: tuple(value.size()) for name, value in get_model_state_dict(root).items()}
        state = get_optimizer_state_dict(root, inner_optimizers(optimizer))["state"]
        per_param = {name: (shapes[name], None, entries) for name, entries in state.items()}
    return [
        (f"{name}.{key}", None if position is None else f"state.{position}.{key}", shape)
        for name, (shape, position, entries) in per_param.items()
        for key, value in entries.items()
        if torch.is_tensor(value) and value.dim() > 0
    ]


def param_chunks(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, tuple]:
    """Per non-scalar state of a DTensor param, keyed as `sharded_states_expected` keys it, the block
    (offsets, sizes) of its param this rank holds, as DCP's own planner cuts it."""
    names = {param: name for name, param in named_parameters_as_built(model)}
    chunks = {}
    for param, entries in optimizer_state_of(optimizer).items():
        if not isinstance(param, DTensor):
            continue
        (chunk,) = param.__create_chunk_list__()
        block = (tuple(chunk.offsets), tuple(chunk.sizes))
        chunks.update(
            {f"{names[param]}.{key}": block for key, value in entries.items() if torch.is_tensor(value) and value.dim()}
        )
    return chunks


def param_chunks_of_every_rank(per_rank: list[dict[str, tuple]]) -> dict[str, frozenset]:
    """Per state key, the distinct blocks of its param that hold elements, over every rank (replicas hold one block twice)."""
    blocks: dict[str, set] = {}
    for chunks in per_rank:
        for key, (offsets, sizes) in chunks.items():
            if math.prod(sizes):
                blocks.setdefault(key, set()).add((tuple(offsets), tuple(sizes)))
    return {key: frozenset(found) for key, found in blocks.items()}


def checkpoint_rank0_sees(directory: str) -> Path | None:
    """Where rank 0 finds the DCP checkpoint under `directory` once every rank's save returned, the
    same answer on every rank, so all of them take the same path (a fallback save is collective)."""
    dist.barrier()
    found = [find_checkpoint(directory) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(found, src=0)
    return found[0]


def on_rank_reshard(recipe: Recipe, checkpoint_dir: str, src: World, dst: World) -> dict:
    """Both sides in sub-worlds of the cell's ranks: train and save in world `src`, then load into a
    fresh stack in world `dst`, train on and compare (rank 0 is in both worlds)."""
    rank = dist.get_rank()
    meshes = {world: world_mesh(world) for world in (src, dst)}
    errors = save_side(recipe, src, meshes[src], checkpoint_dir, own_worlds=False) if rank < src.size else []
    dist.barrier()
    result = side_result(errors)
    if rank < dst.size:
        result = load_side(recipe, src, dst, meshes[dst], checkpoint_dir, errors, own_worlds=False)
    dist.barrier()
    return result


def on_rank_save_in_own_world(recipe: Recipe, checkpoint_dir: str, src: World) -> list[str]:
    """The save side in a world of its own (every rank of this pool is `src`); this rank's errors."""
    return save_side(recipe, src, None, checkpoint_dir, own_worlds=True)


def on_rank_load_in_own_world(recipe: Recipe, checkpoint_dir: str, src: World, dst: World) -> dict:
    """The load side in a world of its own (every rank of this pool is `dst`)."""
    return load_side(recipe, src, dst, None, checkpoint_dir, [], own_worlds=True)


def side_result(errors: list[str]) -> dict:
    """A rank's result of the reshard with nothing compared: its errors only."""
    return {"errors": errors, "problems": [], "layout_after_load": [], "losses_diverged": []}


def saved_state_file(checkpoint_dir: str) -> Path:
    """Where rank 0 of the save side leaves the full tensors it saved, for rank 0 of the load side."""
    return Path(f"{checkpoint_dir}.saved-state.pt")


def save_side(
    recipe: Recipe, src: World, mesh: DeviceMesh | None, checkpoint_dir: str, *, own_worlds: bool
) -> list[str]:
    """Train a step every world size takes alike and save, in world `src` (over `mesh`, None in a
    world of its own); rank 0 writes the full tensors it saved beside the checkpoint. This rank's errors."""
    errors = []
    trained = attempt(
        errors, f"save at {src} ranks", _train_and_save, recipe, src, mesh, checkpoint_dir, own_worlds=own_worlds
    )
    if trained is not None:
        saved = attempt(errors, f"full state after save at {src} ranks", _full_state, *trained, recipe)
        if saved is not None and dist.get_rank() == 0:
            torch.save(saved, saved_state_file(checkpoint_dir))
    return errors


def load_side(
    recipe: Recipe,
    src: World,
    dst: World,
    mesh: DeviceMesh | None,
    checkpoint_dir: str,
    errors: list[str],
    *,
    own_worlds: bool,
) -> dict:
    """Load into a fresh stack in world `dst` (over `mesh`, None in a world of its own), check the
    layout before anything gathers it, then train CONTINUED_STEPS steps beside the run that never
    stopped; rank 0 compares the full tensors with the saved ones and with that run's."""
    rank = dist.get_rank()
    result = side_result(errors)
    loaded = attempt(errors, f"load at {dst} ranks", _load, recipe, dst, mesh, checkpoint_dir, own_worlds=own_worlds)
    if loaded is None:
        return result
    model, optimizer = loaded
    dtensors_expected = recipe.cell["fsdp"] == "fsdp2"
    result["layout_after_load"] = [
        f"rank {rank}: {line}" for line in layout_problems(model, optimizer, dtensors_expected=dtensors_expected)
    ]
    Path(f"{checkpoint_dir}.layout-rank{rank}.txt").write_text(
        "".join(f"{line}\n" for line in result["layout_after_load"])
    )
    state = attempt(errors, f"full state after load at {dst} ranks", _full_state, model, optimizer, recipe)
    hyperparameters = group_hyperparameters(optimizer)
    losses = attempt(errors, f"training after load at {dst} ranks", recipe.train_on, model, optimizer, dst)
    result["problems"] = layout_problems(model, optimizer, dtensors_expected=dtensors_expected)
    continued = attempt(errors, f"full state after training at {dst} ranks", _full_state, model, optimizer, recipe)
    reference = attempt(
        errors, f"the run that never stopped, at {dst} ranks", never_stopped, recipe, dst, mesh, own_worlds
    )
    if losses is None or reference is None or errors:
        return result
    at_save, reference_hyperparameters, reference_losses, reference_end = reference
    quantized = quantized_state_kinds(optimizer)
    result["losses_diverged"] = [
        f"loss of step {step} after the load {float(after):.9g}, never stopped {float(straight):.9g}"
        for step, (after, straight) in enumerate(zip(losses, reference_losses), 1)
        if not bits_equal(after, straight)
    ]
    saved_file = saved_state_file(checkpoint_dir)
    if rank == 0 and state is not None and continued is not None and saved_file.exists():
        saved = torch.load(saved_file)
        result.update(_compare(saved, state))
        differing_settings = settings_differ(hyperparameters, reference_hyperparameters)
        result.update(continuation(saved, at_save, continued, reference_end, src, dst, quantized, differing_settings))
    return result


def never_stopped(
    recipe: Recipe, dst: World, mesh: DeviceMesh | None, own_worlds: bool
) -> tuple[dict[str, torch.Tensor], list[dict], list[torch.Tensor], dict[str, torch.Tensor]]:
    """The run that never stopped, in world `dst`: built from the save's seed, its step before the save
    replayed here (the same batch on every rank, so its mean gradient is the saved run's), then the
    steps the loaded stack trains. Its full tensors at the save point, its losses, its full tensors at the end."""
    model, optimizer = recipe.build(SAVE_SEED, mesh, dst.of(recipe.cell) if own_worlds else None)
    recipe.train_step(model, optimizer, SAVE_SEED, dst, alike=True)
    at_save = _full_state(model, optimizer, recipe)
    hyperparameters = group_hyperparameters(optimizer)
    losses = recipe.train_on(model, optimizer, dst)
    return at_save, hyperparameters, losses, _full_state(model, optimizer, recipe)


def continuation(
    saved: dict[str, torch.Tensor],
    at_save: dict[str, torch.Tensor],
    continued: dict[str, torch.Tensor],
    reference_end: dict[str, torch.Tensor],
    src: World,
    dst: World,
    quantized: list[str],
    hyperparameters_differ: tuple[dict, dict] | None = None,
) -> dict:
    """The training after the load against the run that never stopped: compared bit for bit where the
    state is plain, both runs' param-group settings agree and that run's replayed step reproduced the
    saved state bit for bit; else not compared, saying why."""
    if quantized:
        why = (
            f"not compared: the optimizer keeps its state as {', '.join(quantized)}, which the suite reads "
            f"dequantized; equal values there do not pin the codes and scales stored per shard, so no "
            f"bit-for-bit claim on the steps after a load at {dst} ranks follows"
        )
        return {"continued": why, "continued_mismatches": [], "continued_compared": False}
    if hyperparameters_differ:
        loaded, straight = hyperparameters_differ
        why = (
            f"not compared: the optimizer's param-group settings after the load ({loaded}) are not the run that "
            f"never stopped's ({straight}): the stack's scheduler sets them, which resume checks, not dtensor_optim"
        )
        return {"continued": why, "continued_mismatches": [], "continued_compared": False}
    replay = _compare(saved, at_save, "saved", "after the replayed step")
    if replay["mismatches"]:
        why = (
            f"not compared: the run that never stopped, replayed at {dst} ranks, does not reach the saved state "
            f"bit for bit ({len(replay['mismatches'])} of {replay['compared']} tensors differ, e.g. {replay['mismatches'][0]}): "
            f"its step's mean gradient and forward sum in another order at {dst} ranks than at {src}, and no bound "
            f"on {CONTINUED_STEPS} optimizer steps after it follows from that"
        )
        return {"continued": why, "continued_mismatches": [], "continued_compared": False}
    compared = _compare(reference_end, continued, "never stopped", "after the load")
    return {
        "continued": f"{CONTINUED_STEPS} steps, {compared['compared']} tensors and every loss compared bit for bit",
        "continued_mismatches": compared["mismatches"],
        "continued_compared": True,
    }


def layout_lines_written(checkpoint_dir: Path) -> list[str]:
    """The layout problems each rank wrote right after its load, before any gather: what is left to
    report when a later gather crashed the ranks."""
    files = sorted(checkpoint_dir.parent.glob(f"{checkpoint_dir.name}.layout-rank*.txt"))
    return [line for file in files for line in file.read_text().splitlines()]


def _train_and_save(
    recipe: Recipe, world: World, mesh: DeviceMesh | None, checkpoint_dir: str, *, own_worlds: bool
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A stack built in `world` (over `mesh`; None: a world of its own, built for that world's cell)
    takes the step every world size takes alike, then saves through the checkpointer where it
    reshards, else torch's helpers."""
    cell = world.of(recipe.cell) if own_worlds else None
    model, optimizer = recipe.build(SAVE_SEED, mesh, cell)
    recipe.train_step(model, optimizer, SAVE_SEED, world, alike=True)
    if recipe.reshards_through_checkpointer(own_worlds):
        recipe.checkpointer(model, optimizer, checkpoint_dir, mesh, cell).save(1)
        return model, optimizer
    root = state_dict_root(model)
    state = {
        "model": get_model_state_dict(root),
        "optimizer": get_optimizer_state_dict(root, inner_optimizers(optimizer)),
    }
    dcp.save(state, checkpoint_id=checkpoint_dir, process_group=None if mesh is None else mesh_group(mesh))
    return model, optimizer


def _load(
    recipe: Recipe, world: World, mesh: DeviceMesh | None, checkpoint_dir: str, *, own_worlds: bool
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A fresh stack from another seed with the checkpoint loaded (by the checkpointer, where it reshards)."""
    cell = world.of(recipe.cell) if own_worlds else None
    model, optimizer = recipe.build(LOAD_SEED, mesh, cell)
    if recipe.reshards_through_checkpointer(own_worlds):
        recipe.checkpointer(model, optimizer, checkpoint_dir, mesh, cell).load()
        return model, optimizer
    root = state_dict_root(model)
    state = {
        "model": get_model_state_dict(root),
        "optimizer": get_optimizer_state_dict(root, inner_optimizers(optimizer)),
    }
    dcp.load(state, checkpoint_id=checkpoint_dir, process_group=None if mesh is None else mesh_group(mesh))
    set_model_state_dict(root, state["model"])
    set_optimizer_state_dict(root, inner_optimizers(optimizer), state["optimizer"])
    return model, optimizer


def group_hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Each param group's scalar settings (lr, betas, ...) as the next step will use them."""
    return [
        {key: value for key, value in group.items() if key != "params" and isinstance(value, (int, float, tuple))}
        for part in inner_optimizers(optimizer)
        for group in part.param_groups
    ]


def settings_differ(loaded: list[dict], straight: list[dict]) -> tuple[dict, dict] | None:
    """The first param group whose settings, of those both runs hold, differ: (after the load, never stopped)."""
    for after, before in zip(loaded, straight):
        common = after.keys() & before.keys()
        if any(after[key] != before[key] for key in common):
            return {key: after[key] for key in sorted(common)}, {key: before[key] for key in sorted(common)}
    return None


def _full_state(model: nn.Module, optimizer: torch.optim.Optimizer, recipe: Recipe) -> dict[str, torch.Tensor]:
    """A CPU copy of every model and optimizer tensor, gathered whole on every rank (copied:
    on one rank the state dicts alias the live tensors), the optimizer's made plain by its state
    adapter. Not `cpu_offload`: FSDP1's rank-0-only gather crashes (SIGSEGV) on CPU/gloo in torch 2.13."""
    root = state_dict_root(model)
    tensors = {f"model.{name}": value for name, value in get_model_state_dict(root, options=FULL).items()}
    for name, entries in (
        get_optimizer_state_dict(root, inner_optimizers(optimizer), options=FULL).get("state", {}).items()
    ):
        plain = recipe.plain_state(entries)
        tensors.update({f"optimizer.{name}.{key}": value for key, value in plain.items() if torch.is_tensor(value)})
    return {key: value.detach().to("cpu", copy=True) for key, value in tensors.items()}


def _compare(
    expected: dict[str, torch.Tensor],
    got: dict[str, torch.Tensor],
    expected_as: str = "saved",
    got_as: str = "after load",
) -> dict:
    """Every tensor of `expected` against `got`, bit for bit: what differs, each named as `expected_as` and `got_as`."""
    mismatches = [f"{key}: {expected_as} but missing {got_as}" for key in expected.keys() - got.keys()]
    for key in sorted(expected.keys() & got.keys()):
        before, after = expected[key], got[key]
        if before.dtype != after.dtype or before.shape != after.shape:
            mismatches.append(
                f"{key}: {expected_as} {before.dtype} {list(before.shape)}, {got_as} {after.dtype} {list(after.shape)}"
            )
        elif not bits_equal(after, before):
            diff = (before.float() - after.float()).abs().max().item()
            mismatches.append(
                f"{key}: values differ {got_as} (max abs diff {diff:.3g})"
                if diff
                else f"{key}: {bits_difference(after, before, expected_as)}"
            )
    optimizer_compared = sum(key.startswith("optimizer.") for key in expected)
    return {"compared": len(expected), "optimizer_compared": optimizer_compared, "mismatches": mismatches}
