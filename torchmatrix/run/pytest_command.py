"""The command line, plan file and environment of one group's pytest process, and its start."""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from torchmatrix.env.devices import Environment
from torchmatrix.forks.parent_death import PARENT_PID_VARIABLE
from torchmatrix.forks.preloaded_forks import PreloadedForks
from torchmatrix.matrix.config import Matrix
from torchmatrix.matrix.known_failures import expected_failures
from torchmatrix.matrix.plan import Group
from torchmatrix.matrix.suite_selection import SuiteSelection
from torchmatrix.messages.compile_store import CompileStore
from torchmatrix.messages.group_plan import GroupPlan, SuiteSpec
from torchmatrix.messages.output_cap import DEFAULT_CAP_BYTES
from torchmatrix.run.import_path import user_code_environment
from torchmatrix.run.run_request import RunRequest
from torchmatrix.run.schedule import GroupProcess


def with_launcher(group: Group, node_size: int | None, template: str | None) -> Group:
    """Give a group wider than one node its launch command, with {nnodes} and {nproc_per_node} filled in."""
    if not template or not node_size or group.world_size <= node_size:
        return group
    nnodes = -(-group.world_size // node_size)
    return replace(group, launcher=template.format(nnodes=nnodes, nproc_per_node=node_size))


def group_command(
    matrix: Matrix,
    version: str,
    group: Group,
    environment: Environment,
    logs: Path,
    *,
    gate: Path | None = None,
    output_cap: int = DEFAULT_CAP_BYTES,
    compile_store: CompileStore | None = None,
) -> list[str]:
    """Write the group's plan under `logs` and return the pytest command that runs it.

    A group with a launcher (torchrun, srun) is started through it, one pytest per rank. With a
    `gate`, the process imports and collects, then waits for the gate file before any test.
    """
    plan = logs / f"{group.name}.plan.json"
    suites = {run.suite.name: run.suite for run in group.runs}
    kept = SuiteSelection(tests=group.only_tests).narrowed()
    GroupPlan(
        torch=version,
        world_size=group.world_size,
        device=environment,
        events=str(events_path(logs, group)),
        gate=str(gate) if gate else None,
        launched=bool(group.launcher),
        components=matrix.components,
        optional=dict(matrix.optional),
        suites={name: SuiteSpec(s.path, s.timeout, s.options) for name, s in suites.items()},
        runs=tuple((run.suite.name, run.cell) for run in group.runs),
        output_cap=output_cap,
        compile_store=compile_store,
        only_tests={run.key: kept[run.suite.name] for run in group.runs if run.suite.name in kept},
        known_failures={
            run.key: covered
            for run in group.runs
            if (
                covered := expected_failures(
                    matrix.known_failures, run.suite.name, run.cell, version, environment.base_version
                )
            )
        },
    ).write(plan)
    python = shlex.split(group.launcher) if group.launcher else [sys.executable]
    return [
        *python, "-m", "pytest",
        "-p", "torchmatrix.ranks.plugin",
        "-p", "no:cacheprovider",
        "--continue-on-collection-errors",
        "--torchmatrix-plan", str(plan),
        "--rootdir", str(matrix.root),
        "-q",
        "--tb=short",
        *sorted({s.path for s in suites.values()}),
    ]  # fmt: skip


def events_path(logs: Path, group: Group) -> Path:
    return logs / f"{group.name}.events.jsonl"


def suite_environment(request: RunRequest) -> dict[str, str]:
    """The variables the run's pytest processes and its component check get: the suites' import path,
    and this runner's pid, with which a pytest process ends when the runner does."""
    return {**user_code_environment(request.matrix.root, os.environ), PARENT_PID_VARIABLE: str(os.getpid())}


def start_group(request: RunRequest, group: Group, environment: Environment, forks: PreloadedForks) -> GroupProcess:
    """Start `pytest -p torchmatrix.ranks.plugin` on the group's suites, waiting at its gate."""
    logs = request.version_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)  # a test may have removed the reports directory
    gate = logs / f"{group.name}.go"
    command = group_command(
        request.matrix,
        request.version,
        group,
        environment,
        logs,
        gate=gate,
        output_cap=request.output_cap,
        compile_store=request.compile_store,
    )
    env = suite_environment(request)
    if group.launcher:
        del env[PARENT_PID_VARIABLE]
        env["TORCHMATRIX_DEVICE"] = environment.device_type
    return GroupProcess.start(
        group,
        command,
        cwd=request.matrix.root,
        env=env,
        log=logs / f"{group.name}.log",
        events=events_path(logs, group),
        gate=gate,
        forks=forks,
    )
