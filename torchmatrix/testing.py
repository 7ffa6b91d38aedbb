"""What a suite may use from torchmatrix, and nothing else: the rest of the package may change shape.

In a suite's test functions the plugin provides the fixtures `cell` (the cell's axis values),
`ranks` (`ranks.run(fn, *args)` runs fn on every rank of the cell), `suite_options` (a built-in
suite's as its dataclass: `ResumeOptions`, `GradCkptOptions`, ...),
`components` (matrix.toml's import paths), `once_per_cell(name, compute)` and `tmp_path`. Inside
the functions the ranks run, `current_device()` is this rank's device and `load(path)` turns a
component's import path into the object it names; `build_optimizer(factory, model, ...)` calls an
`optimizer_<value>` factory as the protocol says and `accepts(factory, keyword)` says whether a
factory takes an optional keyword, `call_accepting(factory, ...)` passes only the keywords it
takes, `is_bound_checkpointer(factory)` tells the checkpointer's two forms apart, `inner_optimizers(optimizer)`
the optimizers an optimizer container holds (the optimizer itself otherwise); `clean_name` strips wrapper prefixes off a parameter's name.
`cell_mesh(cell)` is the DeviceMesh the cell's `mesh` axis names (1-D `flat` by default; `hsdp` and
`fsdp_tp` 2-D) and `cell_layout(cell)` its kind, dim names and shape, `mesh_group(mesh)` the process group over all its ranks, and `data_parallel_rank(cell)`
/ `data_parallel_size(cell)` say which batch a rank trains on (the ranks of a tensor-parallel group share one).
`implementation_of(cell)` is the cell's `optimizer_impl` (`IMPLEMENTATION_AXIS`; one of `IMPLEMENTATIONS`, `DEFAULT_IMPLEMENTATION`
where the matrix has no such axis), which `build_optimizer(..., implementation=...)` hands to a factory naming
`implementation`; a factory raises `UnavailableImplementation(reason)` for one it cannot build here, and the
suites skip that cell's optimizer tests with the reason.
`RESUME_BF16_PARAM_OPTIMIZERS` is the resume suite's default for which optimizers get bf16
params (the sensitivity command reads it too). For checkpoints across versions, `writes_dir(run_dir,
version, cell_id)` is where a version's cross_version checkpoint of a cell lives, with its
`EXPECTED_FILE`, and `planned_options(config, suite)` gives a suite module's pytest_generate_tests
the options the runner planned for it. `root_cause(error)` is an exception's root cause line, as
the reports show it. `capture_rng_state()`, `restore_rng_state(state)` and `rng_streams()` are the
process's RNG state (torch CPU, every CUDA device, python `random`, numpy) as one value.
"""

from torchmatrix.components.calling import accepts, build_optimizer, call_accepting, is_bound_checkpointer
from torchmatrix.components.loading import load
from torchmatrix.components.optimizer_implementations import (
    DEFAULT_IMPLEMENTATION,
    IMPLEMENTATION_AXIS,
    IMPLEMENTATIONS,
    UnavailableImplementation,
    implementation_of,
)
from torchmatrix.components.optimizer_like import inner_optimizers
from torchmatrix.components.parameter_names import clean_name
from torchmatrix.components.protocol import RESUME_BF16_PARAM_OPTIMIZERS
from torchmatrix.matrix.suite_options import (
    DTYPES,
    REDUCE_DTYPES,
    CollectivesOptions,
    CrossVersionOptions,
    DtensorOptimOptions,
    GradCkptOptions,
    ParallelEquivalenceOptions,
    ResumeOptions,
    SuiteOptions,
)
from torchmatrix.messages.cross_version import EXPECTED_FILE, writes_dir
from torchmatrix.ranks.cell_mesh import cell_layout, cell_mesh, data_parallel_rank, data_parallel_size, mesh_group
from torchmatrix.ranks.plugin import planned_options
from torchmatrix.ranks.rng_state import capture_rng_state, restore_rng_state, rng_streams
from torchmatrix.ranks.root_cause import root_cause
from torchmatrix.ranks.worker import current_device

__all__ = [
    "DEFAULT_IMPLEMENTATION",
    "EXPECTED_FILE",
    "IMPLEMENTATION_AXIS",
    "IMPLEMENTATIONS",
    "RESUME_BF16_PARAM_OPTIMIZERS",
    "accepts",
    "build_optimizer",
    "call_accepting",
    "cell_layout",
    "cell_mesh",
    "clean_name",
    "current_device",
    "implementation_of",
    "inner_optimizers",
    "is_bound_checkpointer",
]
__all__ += ["data_parallel_rank", "data_parallel_size", "load", "mesh_group", "planned_options", "writes_dir"]
__all__ += ["UnavailableImplementation", "root_cause", "DTYPES", "REDUCE_DTYPES"]
__all__ += ["capture_rng_state", "restore_rng_state", "rng_streams"]
__all__ += [
    "CollectivesOptions",
    "CrossVersionOptions",
    "DtensorOptimOptions",
    "GradCkptOptions",
    "ParallelEquivalenceOptions",
    "ResumeOptions",
    "SuiteOptions",
]
