"""Nox sessions of torchmatrix: declarations only; the bodies live in torchmatrix.sessions.

nox -s gpu_matrix                          every torch version in matrix.toml
nox -s "gpu_matrix(torch='2.14.1')" -- --only fsdp=fsdp2 --shard 1/4
nox -s report -- reports/<run-id> [--compare RUN]
nox -s merge -- DIR... --out DIR
nox -s list [-- --json]                    the cells; also: nox -s compare -- RUN_A RUN_B, nox -s cli -- --help
nox -s hf_matrix                           the suites on a tiny Hugging Face Llama (examples/hf_llama)
nox -s optim_matrix                        torchao, torch-optimi, bitsandbytes optimizers (examples/optimizers)
nox -s titan_matrix                        the suites on torchtitan's own stack (examples/torchtitan)
nox -s lightning_matrix                    the suites on a Lightning Fabric stack (examples/lightning)
nox -s accelerate_matrix                   the suites on Hugging Face accelerate with FSDP2 (examples/accelerate)
nox -s sensitivity [-- --mutants A,B]      would the suites catch generic mutants of [components]?
nox -s bisect -- --good 2.13.0 --bad 2.15.0 [-k EXPR]   first release where a test regressed (or -- --from RUN)
nox -s tests_fast                          the fast lane (no rank processes, a few minutes); nox -s tests: all
nox -s docs                                the documentation site, built strictly (site/)

The sessions a user's repository gets too (gpu_matrix, report, list, compare, cli, merge,
sensitivity, bisect) are declared in torchmatrix.nox_sessions; this file adds the checkout's own.
"""

import os
import sys

import nox

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchmatrix import sessions  # noqa: E402
from torchmatrix.nox_sessions import *  # noqa: E402, F403
from torchmatrix.nox_sessions import MATRIX, RUN_ID, lock_matrix_sessions  # noqa: E402

nox.needs_version = ">=2026.7.11"  # CommandFailed.return_code; the uv probe runs late enough to filter


@nox.session
@nox.parametrize("torch", [v for v in sessions.hf_llama_matrix().versions if v != "system"])
def hf_matrix(session, torch):
    """The suites on a tiny Hugging Face Llama (examples/hf_llama), one venv per torch version."""
    sessions.hf_matrix(session, torch, RUN_ID)


@nox.session
@nox.parametrize("torch", [v for v in sessions.optimizers_matrix().versions if v != "system"])
def optim_matrix(session, torch):
    """The resume and dtensor_optim suites on the ecosystem's precision-aware optimizers (examples/optimizers)."""
    sessions.optim_matrix(session, torch, RUN_ID)


@nox.session
@nox.parametrize("torch", [v for v in sessions.torchtitan_matrix().versions if v != "system"])
def titan_matrix(session, torch):
    """The suites on torchtitan's Llama 3 debug model, parallelize_llama and CheckpointManager (examples/torchtitan)."""
    sessions.titan_matrix(session, torch, RUN_ID)


@nox.session
@nox.parametrize("torch", [v for v in sessions.lightning_fabric_matrix().versions if v != "system"])
def lightning_matrix(session, torch):
    """The resume and dtensor_optim suites on Lightning Fabric: FSDPStrategy, ModelParallelStrategy, fabric.save/load (examples/lightning)."""
    sessions.lightning_matrix(session, torch, RUN_ID)


@nox.session
@nox.parametrize("torch", [v for v in sessions.accelerate_hf_matrix().versions if v != "system"])
def accelerate_matrix(session, torch):
    """The suites on Hugging Face accelerate: its FSDP2 plugin, prepare, backward, save_state/load_state (examples/accelerate)."""
    sessions.accelerate_matrix(session, torch, RUN_ID)


@nox.session
def tests(session):
    """The runner's own tests (pytest-xdist), on the baseline torch: the full lane CI runs."""
    sessions.tests(session, MATRIX.baseline)


@nox.session
def tests_fast(session):
    """The fast lane of the runner's tests: none that starts rank processes or a run; run it first."""
    sessions.tests(session, MATRIX.baseline, fast=True)


@nox.session
def docs(session):
    """The documentation site (MkDocs, Material): warnings, broken links and anchors are errors."""
    sessions.docs(session)


@nox.session
def lint(session):
    """ruff over the project."""
    sessions.lint(session)


# Last, once every session is declared (with its tags): nox's -s, -k and -t select as they will.
MATRIX_LOCK = lock_matrix_sessions(
    hf_matrix=sessions.hf_llama_matrix().versions,
    optim_matrix=sessions.optimizers_matrix().versions,
    titan_matrix=sessions.torchtitan_matrix().versions,
    lightning_matrix=sessions.lightning_fabric_matrix().versions,
    accelerate_matrix=sessions.accelerate_hf_matrix().versions,
)
