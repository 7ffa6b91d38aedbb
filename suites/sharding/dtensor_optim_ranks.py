"""dtensor_optim's rank functions (`on_rank_*`, run in every rank process): each state's layout, the
sharded save, and the two sides of a reshard with the steps after it and the run that never stopped."""

from __future__ import annotations

import math
from pathlib import Path

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
    UnavailableImplementation,
    bits_equal,
    mesh_group,
    state_dict_root,
)

from ..checkpoints.dcp_layout import find_checkpoint
from ..comparison.differences import tensor_difference
from ..state.built_names import named_parameters_as_built
from ..state.optimizer_state import inner_optimizers, optimizer_state_of, param_groups_of, quantized_state_kinds
from .dtensor_optim_recipe import CONTINUED_STEPS, Recipe, World, world_mesh
from .mesh_placements import placement_problems

SAVE_SEED, LOAD_SEED = 0, 1
FULL = StateDictOptions(full_state_dict=True)
TORCH_HELPERS = "torch get_optimizer_state_dict + dcp.save"


# ---- main process: which cells and components this suite can check --------------------------


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
    state = _helpers_state(model, optimizer)
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
    state = _helpers_state(model, optimizer)
    dcp.load(state, checkpoint_id=checkpoint_dir, process_group=None if mesh is None else mesh_group(mesh))
    root = state_dict_root(model)
    set_model_state_dict(root, state["model"])
    set_optimizer_state_dict(root, inner_optimizers(optimizer), state["optimizer"])
    return model, optimizer


def _helpers_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The model's and optimizer's state dicts as torch's helpers give them, what dcp saves and loads in
    place where the checkpointer does not reshard."""
    root = state_dict_root(model)
    return {
        "model": get_model_state_dict(root),
        "optimizer": get_optimizer_state_dict(root, inner_optimizers(optimizer)),
    }


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
    mismatches += [
        f"{key}: {difference}"
        for key in sorted(expected.keys() & got.keys())
        if (difference := tensor_difference(got[key], expected[key], expected_as))
    ]
    optimizer_compared = sum(key.startswith("optimizer.") for key in expected)
    return {"compared": len(expected), "optimizer_compared": optimizer_compared, "mismatches": mismatches}
