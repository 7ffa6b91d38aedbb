"""Checkpoints across torch versions: how a run plans the cross_version suite, and the read pass.

The built-in suite `cross_version` runs in every version's own session and writes, per cell, a
checkpoint through the user's checkpointer with the values it must restore in a version-neutral
form: `<run>/torch-<W>/checkpoints/<cell-id>/`. Reading needs the other torch, so the reads run
after every session wrote, in one pass (`torchmatrix cross-read RUN`, which `nox -s report` runs
first): each version's interpreter on this machine (its gpu_matrix venv, or `--python V=PATH`),
with this machine's matrix.toml, loads the other versions' writes and reports into
`<run>/torch-<R>/reads/<cell-id>.xml`. The baseline reads every candidate's writes (rollback);
each candidate reads the baseline's (forward). Session order, `-R`, shards and `merge` do not
matter: a pass reads whatever writes the run directory holds, and a direction with no writes or no
reader is reported as not checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from torchmatrix.env.version_venv import gpu_matrix_python
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.config import Matrix, Suite
from torchmatrix.matrix.suite_options import SuiteOptions
from torchmatrix.messages.cross_version import READS_FILE, SUITE, peers
from torchmatrix.messages.run_plan import PlanFileError, read_plan
from torchmatrix.user_error import UserError


def suites_for(
    matrix: Matrix, version: str, run_dir: Path, *, reads: bool, paired: tuple[str, ...] | None = None
) -> dict[str, Suite]:
    """The matrix's suites as a run of `version` plans them: `cross_version` told where the run
    directory is and which versions pair with this one (`paired`, where the caller names them:
    bisect pairs releases matrix.toml does not list); a read pass runs the reading tests only."""
    suite = matrix.suites.get(SUITE)
    if suite is None:
        return {} if reads else dict(matrix.suites)
    pairs = list(paired) if paired is not None else peers(matrix, version)
    runner_set = {"run_dir": str(run_dir), "torch": version, "peers": tuple(pairs)}
    typed = isinstance(suite.options, SuiteOptions)
    options = replace(suite.options, **runner_set) if typed else {**suite.options, **runner_set}
    path = str(Path(suite.path).with_name(READS_FILE)) if reads else suite.path
    cross = replace(suite, path=path, options=options)
    return {SUITE: cross} if reads else {**matrix.suites, SUITE: cross}


class CrossReadError(UserError, ValueError):
    """A read pass refused before it starts: the path holds no torch-*/plan.json."""


def read_pass(
    run_dir: Path, matrix: Matrix, envdir: Path, interpreters: Mapping[str, str] | None = None, stream=sys.stderr
) -> ExitCode | int:
    """Run each version's reads of the other versions' writes in that version's interpreter on this
    machine (`interpreters[V]`, else gpu_matrix's venv in `envdir`), with this machine's `matrix`;
    FAILED when a read failed, USAGE when a plan.json could not be read (the other versions still read),
    else PASSED.

    Nothing in the run directory is executed or trusted: its plan.json files say which versions
    wrote and which cells they planned (names checked), never which interpreter, matrix or
    environment to use. A version without an interpreter here is skipped with one line: its
    reads stay not checked."""
    plans = sorted(run_dir.glob("torch-*/plan.json"))
    if not plans:
        raise CrossReadError(
            f"{run_dir} is not a run directory (no torch-*/plan.json in it); pass one under reports/, e.g. reports/latest"
        )
    worst = ExitCode.PASSED
    for plan_path in plans:
        try:
            plan = read_plan(plan_path)
        except PlanFileError as error:
            print(f"torchmatrix: error: cross-read: {error}", file=stream)
            worst = ExitCode.USAGE
            continue
        if SUITE not in plan.suites or not plan.cells:
            continue
        python, reason = reader_interpreter(plan.torch, matrix, envdir, interpreters or {})
        if python is None:
            print(
                f"torchmatrix: cross-read: torch {plan.torch}'s reads of the other versions' checkpoints are not checked: {reason}",
                file=stream,
            )
            continue
        command = [python, "-m", "torchmatrix", "run", "--cross-version-reads", "--torch", plan.torch]
        command += ["--config", str(matrix.path), "--reports", str(run_dir.parent)]
        command += ["--run-id", run_dir.name, "--restart"]  # a failed read is re-read alone: confirmed, reproducible
        environment = {**os.environ, **matrix.install(plan.torch).env}
        try:
            code = subprocess.run(command, env=environment, check=False).returncode
        except OSError as error:
            print(
                f"torchmatrix: cross-read: torch {plan.torch}'s reads are not checked: {python} did not start ({error.strerror})",
                file=stream,
            )
            continue
        if code not in (ExitCode.PASSED, ExitCode.FAILED):
            return code  # the reader's own end: interrupted, or killed
        worst = max(worst, ExitCode(code))  # a plan refused (USAGE) outranks a failed read (FAILED)
    return worst


def reader_interpreter(
    version: str, matrix: Matrix, envdir: Path, interpreters: Mapping[str, str]
) -> tuple[str | None, str]:
    """The interpreter on this machine that reads for torch `version`, or None and why there is none."""
    if version not in matrix.versions:
        return None, f"{version} is not in [torch].versions of {matrix.path.name} ({', '.join(matrix.versions)})"
    if version in interpreters:
        return interpreters[version], ""
    python = gpu_matrix_python(envdir, version)
    if python is None:
        return None, f"nox is not installed, so there is no gpu_matrix venv; pass --python {version}=PATH"
    if not python.is_file() or not os.access(python, os.X_OK):
        return (
            None,
            f"no gpu_matrix venv of it at {python.parent.parent} (`nox -s gpu_matrix` makes it); or pass --python {version}=PATH",
        )
    return str(python), ""
