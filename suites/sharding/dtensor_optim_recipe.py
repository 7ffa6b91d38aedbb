"""What dtensor_optim builds on every rank: the stack's model or the uneven probe, its optimizer and
scheduler (a `Recipe`), and the world each side of a reshard runs in (a `World`)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from torchmatrix.testing import (
    build_optimizer,
    cell_layout,
    cell_mesh,
    current_device,
    data_parallel_rank,
    group_names_of,
    implementation_of,
    load,
    mesh_group,
    user_model,
)

from ..checkpoints.checkpointer_forms import RunCheckpointer, reshards_itself
from ..components.model_output import call_model, loss_of
from ..components.parallelize_component import parallelized
from ..components.scheduler_component import build_scheduler
from ..components.training_step import build_training_step
from ..state.optimizer_state import state_adapter
from .mesh_placements import TensorParallelPlan

LR = 1e-2
FLAT = "flat"
CONTINUE_SEEDS = (10, 20)
CONTINUED_STEPS = len(CONTINUE_SEEDS)
SUB_WORLD_MESHES: dict[int, DeviceMesh | None] = {}


# ---- main process: which cells and components this suite can check --------------------------


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

    Created once per rank process, by every rank in the same order (new_group is collective),
    named from a range of their own (a compiled cell's graphs over them are found in the compile
    store whatever groups the process made before), and kept: a group destroyed and created again
    under the same name would rendezvous on the previous one's stale store keys."""
    if not SUB_WORLD_MESHES:
        device_type = current_device().type
        with group_names_of(("sub_worlds", device_type, dist.get_world_size())):
            for size in range(1, dist.get_world_size()):
                group = dist.new_group(list(range(size)))
                inside = dist.get_rank() < size
                SUB_WORLD_MESHES[size] = DeviceMesh.from_group(group, device_type) if inside else None
    return SUB_WORLD_MESHES


class IdleLoader:
    """The `loader` a checkpointer's save receives here: a position that never moves, since
    dtensor_optim reads no batch through it."""

    def state_dict(self) -> dict:
        return {"position": 0}

    def load_state_dict(self, state: dict) -> None:
        pass
