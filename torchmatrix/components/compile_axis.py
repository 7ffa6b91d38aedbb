"""The `compile` axis: the torch.compile backend a cell's model compiles its blocks with (`none`: eager),
read by the reference `parallelize` (models/block_compile.py) and by the runner, which prepares the
compiler for the ranks of a process whose cells compile (torchmatrix.ranks.compiler_warmup)."""

from __future__ import annotations

from collections.abc import Mapping

from torchmatrix.components.optimizer_implementations import COMPILED_STEP, implementation_of

COMPILE_AXIS = "compile"
NOT_COMPILED = "none"
DEFAULT_BACKEND = "inductor"  # torch.compile's, which the compiled optimizer step uses
AOT_EAGER = "aot_eager"


def compile_backends(cell: Mapping[str, object]) -> frozenset[str]:
    """The torch.compile backends the cell runs: its blocks' (`compile`) and its optimizer step's
    (`optimizer_impl = "compiled"`); none for an eager cell."""
    backends = {
        str(cell.get(COMPILE_AXIS, NOT_COMPILED)),
        DEFAULT_BACKEND if implementation_of(cell) == COMPILED_STEP else NOT_COMPILED,
    }
    return frozenset(backends - {NOT_COMPILED})


def aot_eager_alone(cell: Mapping[str, object]) -> bool:
    """Whether aot_eager is the cell's only backend, the one case its graphs go to the compile store
    (torchmatrix.ranks.aot_eager_cache)."""
    return compile_backends(cell) == {AOT_EAGER}


def graphs_kept(cell: Mapping[str, object]) -> bool:
    """Whether the compile store keeps what the cell compiles between runs: Inductor's graphs and kernels,
    and aot_eager's graphs where it is the only backend; any other backend compiles afresh in every run."""
    return DEFAULT_BACKEND in compile_backends(cell) or aot_eager_alone(cell)
