"""What a suite may use from torchmatrix, and nothing else: the rest of the package may change shape.

The plugin's fixtures in a suite's tests: `cell`, `ranks` (`ranks.run(fn, *args)` on every rank),
`suite_options` (a built-in suite's dataclass, e.g. `ResumeOptions`), `components` (import paths),
`once_per_cell(name, compute)`, `tmp_path` (docs/how-to/write-a-suite.md). Here, for the ranks:

- components: `load(path)`; `build_optimizer`, `accepts`, `call_accepting` (optional keywords only
  where a signature names them); `is_bound_checkpointer` (the checkpointer's two forms);
  `inner_optimizers` (what a container holds); `clean_name` (a parameter name without wrapper prefixes).
- wrappers (a trainer's module, torch.compile, DDP, FSDP1, at any depth): `wrapper_chain(model)`,
  `user_model(model)`, `fsdp1_root(model)`, `state_dict_root(model)` (what torch's state-dict helpers
  take), `name_below_wrappers(model, name)`.
- the rank: `current_device()`; `cell_mesh(cell)`, `cell_layout(cell)`, `mesh_group(mesh)`,
  `data_parallel_rank(cell)`, `data_parallel_size(cell)` (docs/explanation/2d-meshes.md);
  `with group_names_of(key):` around groups a suite makes itself, so their names do not depend on
  what the process made before (docs/explanation/compile.md).
- optimizer implementations: `implementation_of(cell)`, `IMPLEMENTATION_AXIS`, `IMPLEMENTATIONS`,
  `DEFAULT_IMPLEMENTATION`, `UnavailableImplementation(reason)` (the cell's optimizer tests skip).
- checkpoint modes: `saves_asynchronously(cell_id, patterns)`, `checkpointer_path(components, asynchronous)`,
  `UnavailableCheckpointMode(reason)` (a checkpointer that cannot save so here: the cell's resume tests skip).
- options: the `*Options` dataclasses, `SuiteOptions`, `DTYPES`, `REDUCE_DTYPES`,
  `RESUME_BF16_PARAM_OPTIMIZERS`, `planned_options(config, suite)`.
- across versions: `writes_dir(run_dir, version, cell_id)` and its `EXPECTED_FILE`.
- failures and RNG: `root_cause(error)` (the reports' root cause line); `CONSEQUENCE_OF` and
  `consequence_of(tests)` (a test property: this failure follows from those tests', so the reports
  list it under their cause); `capture_rng_state()`,
  `restore_rng_state(state)`, `rng_streams()` (torch CPU, every CUDA device, `random`, numpy).
- compiling: `reset_keeping_time()` (`torch.compiler.reset()`, the test's `compile_seconds` kept), for a
  step that must compile as a fresh process does, not reuse what the cell's earlier tests compiled.
"""

from torchmatrix.components.calling import accepts, build_optimizer, call_accepting, is_bound_checkpointer
from torchmatrix.components.checkpoint_modes import UnavailableCheckpointMode, checkpointer_path, saves_asynchronously
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
from torchmatrix.components.wrapper_chain import (
    fsdp1_root,
    name_below_wrappers,
    state_dict_root,
    user_model,
    wrapper_chain,
)
from torchmatrix.matrix.suite_options import (
    DTYPES,
    REDUCE_DTYPES,
    CheckpointArchiveOptions,
    CollectivesOptions,
    CrossVersionOptions,
    DtensorOptimOptions,
    GradCkptOptions,
    ParallelEquivalenceOptions,
    PeakMemoryOptions,
    ResumeOptions,
    SuiteOptions,
)
from torchmatrix.messages.consequences import CONSEQUENCE_OF, consequence_of
from torchmatrix.messages.cross_version import EXPECTED_FILE, writes_dir
from torchmatrix.messages.root_cause import root_cause
from torchmatrix.ranks.bitwise import bits_equal, same_width_integer
from torchmatrix.ranks.cell_mesh import cell_layout, cell_mesh, data_parallel_rank, data_parallel_size, mesh_group
from torchmatrix.ranks.compile_time import reset_keeping_time
from torchmatrix.ranks.mesh_cache_keys import group_names_of
from torchmatrix.ranks.plugin import planned_options
from torchmatrix.ranks.rng_state import capture_rng_state, restore_rng_state, rng_streams
from torchmatrix.ranks.worker import current_device

__all__ = [
    "CheckpointArchiveOptions",
    "CONSEQUENCE_OF",
    "DEFAULT_IMPLEMENTATION",
    "DTYPES",
    "EXPECTED_FILE",
    "IMPLEMENTATION_AXIS",
    "IMPLEMENTATIONS",
    "REDUCE_DTYPES",
    "RESUME_BF16_PARAM_OPTIMIZERS",
    "CollectivesOptions",
    "CrossVersionOptions",
    "DtensorOptimOptions",
    "GradCkptOptions",
    "ParallelEquivalenceOptions",
    "PeakMemoryOptions",
    "ResumeOptions",
    "SuiteOptions",
    "UnavailableImplementation",
    "UnavailableCheckpointMode",
    "checkpointer_path",
    "saves_asynchronously",
    "same_width_integer",
    "accepts",
    "bits_equal",
    "build_optimizer",
    "call_accepting",
    "capture_rng_state",
    "cell_layout",
    "cell_mesh",
    "clean_name",
    "consequence_of",
    "current_device",
    "data_parallel_rank",
    "data_parallel_size",
    "fsdp1_root",
    "group_names_of",
    "implementation_of",
    "inner_optimizers",
    "is_bound_checkpointer",
    "load",
    "mesh_group",
    "name_below_wrappers",
    "planned_options",
    "reset_keeping_time",
    "restore_rng_state",
    "rng_streams",
    "root_cause",
    "state_dict_root",
    "user_model",
    "wrapper_chain",
    "writes_dir",
]
