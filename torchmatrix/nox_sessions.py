"""The nox sessions of a repository that tests its stack with torchmatrix: importing this module
declares them, so a noxfile.py next to matrix.toml is

    from torchmatrix.nox_sessions import *  # noqa: F403
    MATRIX_LOCK = lock_matrix_sessions()

The matrix is `TORCHMATRIX_CONFIG` or matrix.toml in the noxfile's directory (nox's working
directory while it loads the noxfile); each torch venv gets this same torchmatrix installed.
"""

from __future__ import annotations

import os
import sys

import nox

from torchmatrix import sessions

__all__ = ["MATRIX", "RUN_ID", "gpu_matrix", "report", "list_cells", "compare", "cli", "merge", "sensitivity", "bisect"]
__all__ += ["lock_matrix_sessions"]

sessions.quiet_uv_probe()
MATRIX = sessions.matrix_or_exit(os.environ.get("TORCHMATRIX_CONFIG", "matrix.toml"))
RUN_ID = sessions.run_id_or_exit(os.environ.get("TORCHMATRIX_RUN_ID"))


@nox.session(reuse_venv=True)  # a venv whose stamp says it holds what matrix.toml asks installs nothing
@nox.parametrize("torch", [v for v in MATRIX.versions if v != "system"])
def gpu_matrix(session, torch):
    """Run every suite over every cell for one torch version (one venv per version, kept between runs)."""
    sessions.gpu_matrix(session, MATRIX, torch, RUN_ID)


@nox.session(reuse_venv=True)  # kept while its stamp says it holds this torchmatrix and nox
def report(session):
    """Write a run's junit.xml, results.json and summary pages (default reports/latest); -- --compare RUN diffs."""
    sessions.report(session, MATRIX)


@nox.session(name="list")
def list_cells(session):
    """The cells, versions and baseline: nox -s list [-- --json]."""
    sessions.cli(session, "list")


@nox.session
def compare(session):
    """Upgrade diff of run B against run A: nox -s compare -- RUN_A RUN_B; exit 1 on a regression."""
    sessions.cli(session, "compare")


@nox.session
def cli(session):
    """Any torchmatrix command: nox -s cli -- COMMAND [ARGS] (e.g. -- --help)."""
    sessions.cli(session, "")


@nox.session
def merge(session):
    """Merge report directories of shards and jobs: nox -s merge -- DIR... --out DIR."""
    sessions.merge(session)


@nox.session
def sensitivity(session):
    """Wrap [components] in generic mutants, run the suites on a few cells, fail on a missed mutant."""
    sessions.sensitivity(session, MATRIX)


@nox.session
def bisect(session):
    """First torch release between two pins where a test regressed: -- --good V --bad V [-k ...], or -- --from RUN."""
    sessions.bisect(session, MATRIX)


def lock_matrix_sessions(**other_matrix_sessions: tuple[str, ...]) -> int | None:
    """Call last in the noxfile, once every session is declared (nox's -s, -k and -t select from
    them): hold the envdir's matrix lock when this nox command runs gpu_matrix or one of
    `other_matrix_sessions` (name -> its torch versions)."""
    return sessions.lock_envdir_or_exit(sys.argv[1:], {"gpu_matrix": MATRIX.versions, **other_matrix_sessions})
