"""Where the cell's mesh says each parameter lives, and every way a wrapped model's parameters differ.

On the mesh torchmatrix.testing.cell_mesh builds, a parameter is replicated over "dp_replicate"
(HSDP averages its gradients across the replicas), sharded over "dp_shard" (FSDP2: dim 0 unless
its `shard_placement_fn` picks another) and, over "tp", split as the tensor-parallel plan says:
a colwise projection by output features (weight and bias `Shard(0)`), a rowwise one by input
features (weight `Shard(1)`), everything else replicated. A 2-D mesh handed whole to
`fully_shard` (silently HSDP), a projection the plan missed (replicated, so every tp rank keeps all
of it and all of its optimizer state) or a parameter FSDP left off a dim all show up here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from torchmatrix.testing import cell_layout

from ..state.built_names import named_parameters_as_built

REPLICATE_DIM, SHARD_DIM, TP_DIM = "dp_replicate", "dp_shard", "tp"
COLWISE, ROWWISE = "colwise", "rowwise"
DEFAULT_TENSOR_PARALLEL_PLAN = {COLWISE: ["q_proj", "k_proj", "v_proj", "mlp_in"], ROWWISE: ["o_proj", "mlp_out"]}
"""The reference decoder's plan (torchmatrix.models.parallel.TENSOR_PARALLEL_PLAN), by module name."""


@dataclass(frozen=True)
class TensorParallelPlan:
    """Option `tensor_parallel_plan`: the modules (a name, or a dotted tail of the path) split colwise and rowwise."""

    colwise: tuple[str, ...]
    rowwise: tuple[str, ...]

    @classmethod
    def from_option(cls, value: Mapping | None) -> TensorParallelPlan:
        value = DEFAULT_TENSOR_PARALLEL_PLAN if value is None else value
        unknown = set(value) - {COLWISE, ROWWISE}
        if unknown:
            raise ValueError(
                f"option tensor_parallel_plan: unknown key(s) {sorted(unknown)}; use {COLWISE} and {ROWWISE}"
            )
        return cls(tuple(value.get(COLWISE, ())), tuple(value.get(ROWWISE, ())))

    def style_of(self, module_path: str) -> str | None:
        for style, modules in ((COLWISE, self.colwise), (ROWWISE, self.rowwise)):
            if any(_ends_with(module_path, module) for module in modules):
                return style
        return None

    def expected_tp_placement(self, param_name: str) -> Shard | Replicate:
        module_path, _, leaf = param_name.rpartition(".")
        style = self.style_of(module_path)
        if style == COLWISE:
            return Shard(0)
        if style == ROWWISE and leaf != "bias":
            return Shard(1)
        return Replicate()

    def unmatched(self, param_names: list[str]) -> list[str]:
        """The plan's modules that no parameter belongs to."""
        modules = [name.rpartition(".")[0] for name in param_names]
        return [
            module for module in (*self.colwise, *self.rowwise) if not any(_ends_with(path, module) for path in modules)
        ]


def placement_problems(model: nn.Module, cell, plan: TensorParallelPlan, *, plan_applies: bool) -> list[str]:
    """Every parameter placed otherwise than the cell's named mesh says; nothing for the unnamed flat
    mesh. `plan_applies`: the model is the one the plan is written for (not the suite's probe)."""
    dims = cell_layout(cell).dim_names
    if not dims:
        return []
    named = [(name, param) for name, param in named_parameters_as_built(model) if isinstance(param, DTensor)]
    problems = []
    if plan_applies and TP_DIM in dims:
        problems += [
            f"the tensor-parallel plan names {module}, which no parameter of {type(model).__name__} belongs to: "
            f"set [suites.dtensor_optim.options] tensor_parallel_plan to the modules your `parallelize` splits"
            for module in plan.unmatched([name for name, _ in named])
        ]
    for name, param in named:
        problems += _param_problems(name, param, dims, plan if plan_applies else TensorParallelPlan((), ()))
    return problems


def _param_problems(name: str, param: DTensor, dims: tuple[str, ...], plan: TensorParallelPlan) -> list[str]:
    own = param.device_mesh.mesh_dim_names or ()
    where = f"{name} (param {list(param.shape)} {tuple(param.placements)} over {own or 'an unnamed mesh'})"
    strangers = [dim for dim in own if dim not in dims]
    if strangers or not own:
        return [f"{where} lies on a mesh without the cell's dims {dims}: shard over the mesh `parallelize` is handed"]
    placed = dict(zip(own, param.placements))
    problems = []
    if REPLICATE_DIM in dims and not isinstance(placed.get(REPLICATE_DIM), Replicate):
        got = placed.get(REPLICATE_DIM, f"no {REPLICATE_DIM} dim")
        problems.append(
            f"{where}: {got!r} on {REPLICATE_DIM}, expected Replicate() (HSDP averages it across the replicas)"
        )
    if SHARD_DIM in dims and _shard_dim(placed.get(SHARD_DIM)) is None:
        got = placed.get(SHARD_DIM, f"no {SHARD_DIM} dim")
        problems.append(f"{where}: {got!r} on {SHARD_DIM}, expected FSDP2's Shard")
    if TP_DIM in dims:
        got, wanted = placed.get(TP_DIM, Replicate()), plan.expected_tp_placement(name)
        if not _same_placement(got, wanted, param.ndim):
            problems.append(f"{where}: {got!r} on {TP_DIM}, expected {wanted!r} ({_style_words(plan, name)})")
    return problems


def _same_placement(got, wanted, ndim: int) -> bool:
    if isinstance(wanted, Replicate):
        return isinstance(got, Replicate)
    dim = _shard_dim(got)
    return dim is not None and dim % max(ndim, 1) == wanted.dim


def _shard_dim(placement) -> int | None:
    """The dim a placement shards, counting the strided shard FSDP2 puts over a dim TP already split
    (`_StridedShard`, which is no `Shard` in torch 2.13); None for anything else."""
    if isinstance(placement, Shard) or hasattr(placement, "split_factor"):
        return placement.dim
    return None


def _style_words(plan: TensorParallelPlan, param_name: str) -> str:
    style = plan.style_of(param_name.rpartition(".")[0])
    return f"the plan splits it {style}" if style else "the plan leaves it whole on every tp rank"


def _ends_with(path: str, tail: str) -> bool:
    return path == tail or path.endswith("." + tail)
