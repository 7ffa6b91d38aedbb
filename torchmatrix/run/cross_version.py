"""Checkpoints across torch versions: how a run plans the cross_version suite, and the read pass.

The built-in suite `cross_version` runs in every version's own session and writes, per cell, a
checkpoint through the user's checkpointer with the values it must restore in a version-neutral
form: `<run>/torch-<W>/checkpoints/<cell-id>/`. Reading needs the other torch, so the reads run
after every session wrote, in one pass (`torchmatrix cross-read RUN`, which `nox -s report` runs
first): each version's own interpreter (plan.json records it) loads the other versions' writes and
reports into `<run>/torch-<R>/reads/<cell-id>.xml`. The baseline reads every candidate's writes
(rollback); each candidate reads the baseline's (forward). Session order, `-R`, shards and `merge`
do not matter: a pass reads whatever writes the run directory holds, and a direction with no
writes or no reader is reported as not checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from torchmatrix.matrix.config import ConfigError, Matrix, Suite, load_matrix
from torchmatrix.messages.cross_version import READS_FILE, SUITE, peers
from torchmatrix.messages.run_plan import PlanFileError, read_plan


def suites_for(matrix: Matrix, version: str, run_dir: Path, *, reads: bool) -> dict[str, Suite]:
    """The matrix's suites as a run of `version` plans them: `cross_version` told where the run
    directory is and which versions pair with this one; a read pass runs the reading tests only."""
    suite = matrix.suites.get(SUITE)
    if suite is None:
        return {} if reads else dict(matrix.suites)
    options = {**suite.options, "run_dir": str(run_dir), "torch": version, "peers": peers(matrix, version)}
    path = str(Path(suite.path).with_name(READS_FILE)) if reads else suite.path
    cross = replace(suite, path=path, options=options)
    return {SUITE: cross} if reads else {**matrix.suites, SUITE: cross}


def read_pass(run_dir: Path, config: str | None = None, stream=sys.stderr) -> int:
    """Run each version's reads of the other versions' writes in that version's own interpreter
    (recorded in its plan.json); 1 when a read failed, else 0. A version whose interpreter is not
    on this machine is skipped with a line: its reads stay not checked."""
    worst = 0
    for plan_path in sorted(run_dir.glob("torch-*/plan.json")):
        try:
            plan = read_plan(plan_path)
        except PlanFileError as error:
            print(f"torchmatrix: cross-read: {error}", file=stream)
            continue
        if SUITE not in plan.suites or not plan.cells:
            continue
        python = plan.environment.get("python", "")
        if not python or not Path(python).exists():
            print(
                f"torchmatrix: cross-read: torch {plan.torch}'s interpreter {python or '(not recorded)'} is not on this machine; "
                "its reads of the other versions' checkpoints are not checked",
                file=stream,
            )
            continue
        matrix_path = config or plan.matrix or "matrix.toml"
        command = [python, "-m", "torchmatrix", "run", "--cross-version-reads", "--torch", plan.torch]
        command += ["--config", matrix_path, "--reports", str(run_dir.parent)]
        command += ["--run-id", run_dir.name, "--restart"]  # a failed read is re-read alone: confirmed, reproducible
        code = subprocess.run(command, env=_version_environment(matrix_path, plan.torch), check=False).returncode
        if code not in (0, 1):
            return code
        worst = max(worst, code)
    return worst


def _version_environment(matrix_path: str, version: str) -> dict[str, str]:
    """This environment with the version's `[torch.install."V"] env`, which its cells ran with too
    (a matrix file that does not load is the run's problem to report, not the pass's)."""
    try:
        extra = load_matrix(matrix_path).install(version).env
    except ConfigError:
        extra = {}
    return {**os.environ, **extra}
