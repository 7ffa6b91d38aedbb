"""DTensor optimizer state: laid out like its param, saved as one chunk per rank, exact after a reshard load.

- The bug (../shared/seeds/dtensor-optimizer-state.txt): TransformerEngine's FusedAdam turned the
  state of DTensor params into plain local tensors, so DCP saved each shard as the whole tensor.
- Every check runs on the `model` component and on a probe whose first dims (7, 11) split unevenly
  over 2 and 4 ranks (a state wrapped without its global shape is wrong only there); the `on_rank_*`
  functions (suites/sharding/dtensor_optim_ranks.py) run in every rank process; what they build is a `Recipe`
  (suites/sharding/dtensor_optim_recipe.py).
- Quantized state is laid out as the DTensor that wraps it and compared, after a reshard, through
  the optimizer's state adapter (suites/state/optimizer_state.py), bit for bit (suites/comparison/ulp.py).
- `layout_source`: the DCP checkpoint the `checkpointer` component writes (found by its `.metadata`,
  each state under whatever prefix), else torch's `get_optimizer_state_dict` saved with `dcp.save`.
- `reshard_worlds`: each side of a reshard on sub-worlds of the cell's ranks where `parallelize` takes
  `mesh` and a bound checkpointer `process_group` or `mesh` (cheaper), else in a world of its own, a
  rank pool of that side's size (`ranks.in_world`) whose default group is exactly that world.
- `reshard_source`: the checkpointer's own `save(step)` and `load()` in worlds of their own, or in
  sub-worlds where the bound form takes a `process_group` or `mesh` (suites/checkpoints/checkpointer_forms.py),
  else torch's helpers and DCP.
- `reshard_continued`: after the load, CONTINUED_STEPS steps against the run that never stopped,
  replayed at the load's world size from the save's seed (its step before the save takes the same
  batch on every rank, so its mean gradient is the same at any world size): bit for bit, or not
  compared, saying why, where the replay does not reach the saved state bit for bit.
- The sharded-save check says apart whether the state is stored sharded and whether it is keyed by
  name or by position (suites/checkpoints/dcp_layout.py). No param-shaped state skips; some params without fails.
- Options: `DtensorOptimOptions` (torchmatrix/matrix/suite_options.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from torchmatrix.testing import (
    DEFAULT_IMPLEMENTATION,
    DtensorOptimOptions,
    accepts,
    cell_layout,
    implementation_of,
    is_bound_checkpointer,
    load,
)

from .checkpoints.checkpointer_forms import reshards_itself
from .checkpoints.dcp_layout import ExpectedState, read_layouts, storage_findings
from .sharding.dtensor_optim_ranks import (
    layout_lines_written,
    on_rank_load_in_own_world,
    on_rank_reshard,
    on_rank_save,
    on_rank_save_in_own_world,
    on_rank_state_layout,
    on_rank_unavailable,
    param_chunks_of_every_rank,
    side_result,
)
from .sharding.dtensor_optim_recipe import CONTINUED_STEPS, FLAT, Recipe, World
from .sharding.mesh_placements import TensorParallelPlan

OPTIONS = DtensorOptimOptions  # the dataclass `suite_options` arrives as

MODEL_KINDS = ("model", "uneven_probe")
RESHARDS = ("shrink", "grow")  # W -> W/2 and W/2 -> W for a cell of W ranks: 2->1, 1->2, 4->2, 2->4, ...
RESHARD_THROUGH_CHECKPOINTER = "checkpointer"
RESHARD_THROUGH_TORCH = (
    "torch get/set_model_state_dict and get/set_optimizer_state_dict + dcp.save/load over a process group ({why})"
)
SUB_WORLDS = "sub-worlds of the cell's ranks (the first N of them on a group of their own)"
OWN_WORLDS = "worlds of their own, a rank pool of each side's size whose default group is that world ({why})"


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
    2-D mesh every param is first placed as the mesh says on each of its dims (suites/sharding/mesh_placements.py)."""
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
