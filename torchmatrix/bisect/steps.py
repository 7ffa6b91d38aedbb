"""A bisect's steps: each installs one torch version into its venv (or reuses it) and runs the
selection there with `torchmatrix run`, ending every process the step started."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from torchmatrix.bisect.directions import (
    WRITE_TEST,
)
from torchmatrix.bisect.request import BisectError, BisectRequest
from torchmatrix.bisect.search import Outcome
from torchmatrix.env.version_venv import prepare_venv
from torchmatrix.messages.cross_version import SUITE
from torchmatrix.reports.records import RunResults
from torchmatrix.reports.run_reader import load_results

IMPORT_SECONDS = 300
STEP_GRACE_SECONDS = 30


def since(begun: float) -> float:
    return round(time.time() - begun, 1)


class Steps:
    """Installs and runs of one bisect: numbered [k/N] as the matrix's progress counts versions."""

    def __init__(self, request: BisectRequest, out: Path, planned: int):
        self.request, self.out, self.planned = request, out, planned
        self.started = time.time()
        self.count = 0
        self.log: list[dict] = []
        self.venvs: dict[str, tuple] = {}  # version -> (venv, reused): a venv prepared once per bisect
        self.git_versions: dict[str, str] = {}  # version -> torch.version.git_version, for the commit range

    def run(self, version: str, selection: list[str]) -> tuple[RunResults | None, Outcome, str]:
        """Install `version` (or reuse its venv) and run `selection` there; the results, or None,
        why it was skipped (did not install, or installed and does not import torch) and the reason."""
        step, begun = self._begin(version, {"selection": selection}), time.time()
        skipped = self._prepare(version, step, begun)
        if skipped:
            return None, *skipped
        venv, reused = self.venvs[version]
        run_id = f"step{self.count}-torch-{version}"
        print(
            f"torchmatrix bisect: step {self.count}: torch {version}: running {shlex.join(selection) or 'every cell of matrix.toml'}",
            flush=True,
        )
        self._torchmatrix(venv, version, run_id, ["--torch", "system", *selection], step, begun)
        self.log.append({**step, "installed": True, "reused": reused, "run": run_id, "seconds": since(begun)})
        results = load_results(self.out / "steps" / run_id)
        self.git_versions[version] = results.versions[0].environment.git_version if results.versions else ""
        return results, Outcome.PASSED, ""

    def pair(
        self, version: str, pairs: list[tuple[str, str]], selection: list[str]
    ) -> tuple[RunResults | None, Outcome, str]:
        """Judge checkpoint directions on `version`: in one run directory, each (writer, reader)
        pair's writer writes the selected cells' cross_version checkpoints and its reader reads them.
        `version` is skipped as `run` skips it; the other side (the baseline) must install and import."""
        step = self._begin(version, {"selection": selection, "checkpoints": [list(pair) for pair in pairs]})
        begun = time.time()
        sides = list(dict.fromkeys([version, *(v for pair in pairs for v in pair)]))
        for side in sides:
            skipped = self._prepare(side, step, begun)
            if skipped and side == version:
                return None, *skipped
            if skipped:
                raise BisectError(
                    f"torch {side}, the other side of every checkpoint this bisect reads, {skipped[0].value}: {skipped[1]}"
                )
        run_id = f"step{self.count}-torch-{version}"
        for writer in dict.fromkeys(writer for writer, _ in pairs):
            readers = [reader for w, reader in pairs if w == writer]
            print(
                f"torchmatrix bisect: step {self.count}: torch {writer}: writing checkpoints for torch {', '.join(readers)} "
                f"({shlex.join(selection) or 'every cell'})",
                flush=True,
            )
            peers = [f"--peer={reader}" for reader in readers]
            arguments = ["--torch", writer, *peers, *selection, f"--test={SUITE}::{WRITE_TEST}"]
            self._torchmatrix(self.venvs[writer][0], writer, run_id, arguments, step, begun)
        for reader in dict.fromkeys(reader for _, reader in pairs):
            writers = [writer for writer, r in pairs if r == reader]
            print(
                f"torchmatrix bisect: step {self.count}: torch {reader}: reading the checkpoints of torch {', '.join(writers)}",
                flush=True,
            )
            peers = [f"--peer={writer}" for writer in writers]
            arguments = ["--cross-version-reads", "--torch", reader, *peers, *selection]
            self._torchmatrix(self.venvs[reader][0], reader, run_id, arguments, step, begun)
        reused = all(self.venvs[side][1] for side in sides)
        self.log.append({**step, "installed": True, "reused": reused, "run": run_id, "seconds": since(begun)})
        results = load_results(self.out / "steps" / run_id)
        self.git_versions[version] = results.versions[0].environment.git_version if results.versions else ""
        return results, Outcome.PASSED, ""

    def _begin(self, version: str, step: dict) -> dict:
        self.count += 1
        self.planned = max(self.planned, self.count)
        return {"version": version, **step}

    def _prepare(self, version: str, step: dict, begun: float) -> tuple[Outcome, str] | None:
        """Make `version`'s venv ready once per bisect (reused, or installed); why it cannot be, else None."""
        if version in self.venvs:
            return None
        print(
            f"torchmatrix bisect: step {self.count}: torch {version}: its gpu_matrix venv (installed unless it was before)",
            flush=True,
        )
        venv, installed, reused = prepare_venv(
            self.request.matrix, self.request.envdir, version, self.out / "logs" / f"torch-{version}"
        )
        how = (
            "reusing its venv"
            if reused
            else "installed into its venv"
            if installed.ok
            else "tried to install into its venv"
        )
        print(f"torchmatrix bisect: step {self.count}: torch {version}: {how} {venv.location}", flush=True)
        if not installed.ok:
            print(f"torchmatrix bisect: step {self.count}: torch {version} did not install: {installed.reason}")
            self.log.append({**step, "installed": False, "reason": installed.reason, "seconds": since(begun)})
            return Outcome.NOT_INSTALLED, installed.reason
        broken = import_failure(venv)
        if broken:
            print(f"torchmatrix bisect: step {self.count}: torch {version} installed but does not import: {broken}")
            self.log.append({**step, "installed": True, "imports": False, "reason": broken, "seconds": since(begun)})
            return Outcome.NOT_IMPORTABLE, broken
        self.venvs[version] = (venv, reused)
        return None

    def _torchmatrix(self, venv, version: str, run_id: str, arguments: list[str], step: dict, begun: float) -> None:
        """`torchmatrix run` in `venv` into the step's run directory; a refusal ends the bisect."""
        command = [
            str(venv.python), "-m", "torchmatrix", "run",
            "--config", str(self.request.matrix.path),
            "--reports", str(self.out / "steps"),
            "--run-id", run_id,
            "--progress-part", f"{self.count}/{self.planned}",
            "--progress-since", f"{self.started:.3f}",
            "--no-report-hint",
            *(["--slots", str(self.request.slots)] if self.request.slots else []),
            *arguments,
        ]  # fmt: skip
        try:
            code = run_step_process(command, venv.environment())
        except KeyboardInterrupt:
            self.log.append({**step, "installed": True, "run": run_id, "interrupted": True, "seconds": since(begun)})
            raise
        if code not in (0, 1):
            raise BisectError(f"torch {version}: `torchmatrix run` ended with exit code {code} (see above)")


def import_failure(venv) -> str:
    """Why torch does not import in `venv` (the exception's last line, e.g. a missing libcudart), or ""."""
    done = subprocess.run(
        [str(venv.python), "-c", "import torch"],
        env=venv.environment(),
        capture_output=True,
        text=True,
        check=False,
        timeout=IMPORT_SECONDS,
    )
    if done.returncode == 0:
        return ""
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"python -c 'import torch' exited {done.returncode}"


def run_step_process(command: list[str], env: dict[str, str]) -> int:
    """Run a step's `torchmatrix run` in a process group of its own; interrupted (Ctrl-C, SIGTERM),
    the group is sent SIGTERM (the runner writes what ran and ends its tests), then SIGKILL after
    STEP_GRACE_SECONDS, so nothing the step started outlives the bisect."""
    process = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        return process.wait()
    except BaseException:
        _end_group(process)
        raise


def _end_group(process: subprocess.Popen) -> None:
    for signum, grace in ((signal.SIGTERM, STEP_GRACE_SECONDS), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        try:  # the runner is gone; its group may still hold what it started
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return
