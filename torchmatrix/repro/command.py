"""`torchmatrix repro RUN TEST_ID`: one directory an upstream maintainer can act on for one
confirmed failure: repro.py (the suite's check for that cell, with everything it imports from
this project inlined, ranks started by torch.multiprocessing.spawn; for a cross_version read, a
torch-only script that writes with one version's interpreter and reads with the other's), the
command, the cell, the torch build, `python -m torch.utils.collect_env` from that torch's venv,
and a README laid out as an upstream bug report."""

from __future__ import annotations

import ast
import importlib.util
import json
import pprint
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from torchmatrix.matrix.config import load_matrix
from torchmatrix.reports.machine_paths import without_machine_paths
from torchmatrix.reports.records import RunResults, TestRecord, VersionInfo
from torchmatrix.reports.reproducible import failure_id, is_reproducible
from torchmatrix.reports.run_reader import load_results
from torchmatrix.repro import cross_version
from torchmatrix.repro.environment_summary import environment_lines
from torchmatrix.repro.inlining import inline_check
from torchmatrix.repro.output_directory import MARK, SCRIPT_NAME, check_output, publish
from torchmatrix.status import Status
from torchmatrix.user_error import UserError

REPRO_FILES = (SCRIPT_NAME, "command.txt", "cell.json", "collect_env.txt", "README.md")
SUITE_NEEDS = "torch, pytest and what the components import; not torchmatrix"
COLLECT_ENV_SECONDS = 300
FAILURE_TEXT_LINES = 60
PLACEHOLDERS = ("CHECK: dict = {}", "SOURCES: dict = {}")


class ReproError(UserError):
    """No such failure in the run, or a run without its matrix; the message says what to pass."""


@dataclass(frozen=True)
class Reproducer:
    """A written reproducer directory: how to run its script, and what that needs (said truthfully)."""

    out: Path
    command: str
    needs: str


def write_reproducer(
    run_dir: Path,
    wanted: str,
    *,
    out: Path | None = None,
    python: str | None = None,
    config: str | None = None,
    writer_python: str | None = None,
) -> Reproducer:
    """Write the reproducer directory of the failure `wanted` names, all of it or nothing."""
    results = load_results(run_dir)
    record = _find(results, wanted)
    info = next(v for v in results.versions if v.torch == record.torch)
    out = out or run_dir / "repro" / re.sub(r"[^\w.-]+", "_", failure_id(record)).strip("_")
    check_output(out, set(REPRO_FILES))
    pair = cross_version.pair_of(record)
    root = Path(config).resolve().parent if config else Path.cwd()
    if pair:
        reproducer = Reproducer(out, "", cross_version.NEEDS)
        files = _cross_version_files(results, record, info, reproducer, root, python, writer_python, pair[0])
    else:
        reproducer = Reproducer(out, f"python {SCRIPT_NAME}", SUITE_NEEDS)
        files = _suite_files(results, record, info, reproducer, run_dir, python, config)
    files = {name: without_machine_paths(text, run_dir.resolve(), root) for name, text in files.items()}
    try:
        publish(out, files)
    except OSError as error:
        raise ReproError(f"cannot write {out}: {error.strerror or error}; nothing was written") from None
    return Reproducer(out, files["command.txt"].strip(), reproducer.needs)


def _suite_files(results, record, info, reproducer, run_dir, python, config) -> dict[str, str]:
    """repro.py running the suite's test under pytest with everything it imports from the project inlined."""
    matrix = load_matrix(config or "matrix.toml")  # never the path plan.json records: the run may come from elsewhere
    cell = next((c for c in matrix.cells() if c.id == record.run_cell), None)
    if cell is None or record.suite not in matrix.suites:
        raise ReproError(
            f"{matrix.path} has no cell {record.run_cell} with suite {record.suite}; pass --config with the run's matrix"
        )
    suite = matrix.suites[record.suite]
    sources, suite_file = inline_check(matrix.root / suite.path, list(matrix.components.values()), matrix.root)
    device = "cuda" if info.environment.gpu_count else "cpu"
    check = {
        "suite": record.suite,
        "test": record.test,
        "suite_file": suite_file,
        "cell_id": cell.id,
        "cell": dict(cell),
        "world_size": cell.world_size,
        "device": device,
        "timeout": suite.timeout,
        "options": dict(suite.table),
        "components": dict(matrix.components),
    }
    interpreter = python or _venv_python(matrix.root, record.torch) or sys.executable
    collect_env = _collect_env(interpreter)
    passing = _passing_versions(results, record, run_dir)
    environment = environment_lines(interpreter)
    return {
        SCRIPT_NAME: script_text(check, sources, record, info.environment.torch or record.torch),
        "command.txt": reproducer.command + "\n",
        "cell.json": json.dumps({"id": cell.id, **dict(cell)}, indent=2) + "\n",
        "collect_env.txt": collect_env,
        "README.md": readme(record, info, cell.id, reproducer.command, passing, environment),
    }


def _cross_version_files(results, record, info, reproducer, root, python, writer_python, writer) -> dict[str, str]:
    """repro.py writing the checkpoint with the writer's torch and loading it with the reader's, torch only."""
    reader_found = python or _venv_python(root, record.torch)
    writer_found = writer_python or _venv_python(root, writer)
    reader_python = reader_found or f"/path/to/torch-{record.torch}/bin/python"
    writer_python = writer_found or f"/path/to/torch-{writer}/bin/python"
    run_command = cross_version.command(writer_python, reader_python)
    failure = {
        "writer": writer,
        "reader": record.torch,
        "test": f"{record.suite}::{record.test}",
        "cell": record.run_cell,
        "root_cause": record.message,
    }
    collect_env = _collect_env(reader_python)
    cell = {"id": record.run_cell, **results.cells.get(record.run_cell, {})}
    return {
        SCRIPT_NAME: cross_version.script_text(failure),
        "command.txt": run_command + "\n",
        "cell.json": json.dumps(cell, indent=2) + "\n",
        "collect_env.txt": collect_env,
        "README.md": cross_version.readme(
            record,
            cross_version.Side(writer, _version_of(results, writer), environment_lines(writer_found)),
            cross_version.Side(record.torch, info, environment_lines(reader_found)),
            run_command,
        ),
    }


def _version_of(results: RunResults, torch: str) -> VersionInfo:
    """What the run recorded of `torch` (its build, git version, device); the bare version when it did not run it."""
    return next((v for v in results.versions if v.torch == torch), VersionInfo(torch))


def _find(results: RunResults, wanted: str) -> TestRecord:
    failures = [r for r in results.tests if is_reproducible(r)]
    for record in failures:
        if failure_id(record) == wanted:
            return record
    known = ", ".join(failure_id(r) for r in failures[:5]) or "none"
    raise ReproError(
        f"{wanted!r} is not a confirmed failure of run {results.run_id}; write TORCH/CELL/SUITE::TEST, one of: {known}"
    )


def script_text(check: dict, sources: dict[str, str], record: TestRecord, build: str) -> str:
    """repro.py: what it reproduces (FAILURE), CHECK, the inlined SOURCES, then the harness. Text that
    came from the run (ids, the root cause) is only ever a literal's value, never part of the source."""
    runtime = Path(importlib.util.find_spec("torchmatrix.repro.harness").origin).read_text()
    docstring_end = runtime.index('"""', 3) + 3
    body = runtime[docstring_end:]
    for placeholder in PLACEHOLDERS:
        body = "\n".join(line for line in body.splitlines() if not line.startswith(placeholder))
    inlined = "\n".join(f"SOURCES[{path!r}] = {source_literal(text)}\n" for path, text in sources.items())
    failure = {
        "test": f"{record.suite}::{record.test}",
        "cell": check["cell_id"],
        "world_size": check["world_size"],
        "device": check["device"],
        "torch": build,
        "root_cause": record.message,
    }
    return "\n".join(
        [
            "#!/usr/bin/env python3",
            MARK,
            '"""A suite check that failed under torchmatrix, standalone: FAILURE names the test, its cell, the torch',
            "build it failed on and its root cause.",
            "",
            f"Run: python {SCRIPT_NAME}    (needs {SUITE_NEEDS})",
            "The check is the suite's test, unchanged; the modules it imports from the project that found it",
            "are inlined below (SOURCES) and written to a temporary directory when the script runs.",
            '"""',
            "",
            f"FAILURE = {pprint.pformat(failure, width=100, sort_dicts=False)}",
            "",
            f"CHECK = {pprint.pformat(check, width=100, sort_dicts=False)}",
            "",
            "SOURCES = {}",
            inlined,
            body.strip("\n"),
            "",
            "",
            'if __name__ == "__main__":',
            "    main()",
            "",
        ]
    )


def source_literal(text: str) -> str:
    """A string literal whose value is `text`: raw triple-quoted where that reads back exactly
    (readable source), else repr."""
    raw = f"r'''{text}'''"
    try:
        if ast.literal_eval(raw) == text:
            return raw
    except (SyntaxError, ValueError):
        pass
    return repr(text)


def _venv_python(matrix_root: Path, version: str) -> str | None:
    """The gpu_matrix venv's python of `version`, where nox put it; None when there is none."""
    if importlib.util.find_spec("nox") is None:
        return None
    from torchmatrix.env.version_venv import VersionVenv

    venv = VersionVenv(matrix_root / ".nox", version, {})
    return str(venv.python) if venv.python.is_file() else None


def _collect_env(python: str) -> str:
    try:
        done = subprocess.run(
            [python, "-m", "torch.utils.collect_env"], capture_output=True, text=True, timeout=COLLECT_ENV_SECONDS
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"python -m torch.utils.collect_env with {python} did not finish: {error}\n"
    return f"# {python} -m torch.utils.collect_env\n{done.stdout}{done.stderr}"


def _passing_versions(results: RunResults, record: TestRecord, run_dir: Path) -> list[str]:
    """Where the same test in the same cell passed: this run's other versions, and bisect steps next to it."""
    passing = [
        f"{r.torch} (this run)"
        for r in results.tests
        if (r.suite, r.test, r.run_cell) == (record.suite, record.test, record.run_cell) and r.status is Status.PASSED
    ]
    for report in sorted(run_dir.glob("bisect-*/bisect.json")):
        for regression in _bisected(report):
            if (regression.get("suite"), regression.get("test"), regression.get("cell")) == (
                record.suite,
                record.test,
                record.run_cell,
            ) and regression.get("first_bad"):
                passing.append(
                    f"{regression.get('last_good')} (bisect: the last good release; {regression['first_bad']} is the first bad)"
                )
    return passing


def _bisected(report: Path) -> list[dict]:
    """The regressions a bisect.json records; none from one that is truncated, of another shape or unreadable."""
    try:
        regressions = json.loads(report.read_text()).get("regressions", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [r for r in regressions if isinstance(r, dict)] if isinstance(regressions, list) else []


def readme(
    record: TestRecord, info: VersionInfo, cell_id: str, command: str, passing: list[str], environment: list[str]
) -> str:
    """README.md laid out as an upstream bug report: expected, happened, root cause, how to run it, versions, environment."""
    recorded = info.environment
    build = recorded.torch or record.torch
    text = record.text.strip().splitlines()
    excerpt = "\n".join(text[:FAILURE_TEXT_LINES] + (["..."] if len(text) > FAILURE_TEXT_LINES else []))
    return "\n".join(
        [
            f"# {record.suite}::{record.test} fails on torch {build}",
            "",
            "## What was expected",
            "",
            f"The check passes{', as it does on torch ' + ', '.join(passing) if passing else ''}.",
            "",
            "## What happened",
            "",
            f"On torch {build} ({recorded.description or 'device unknown'}) it {record.status.value}, and failed again when re-run alone:",
            "",
            "```",
            excerpt,
            "```",
            "",
            "## Root cause",
            "",
            f"`{record.message}`",
            "",
            "## Reproduce",
            "",
            f"Needs {SUITE_NEEDS}:",
            "",
            "```shell",
            command,
            "```",
            "",
            f"Cell `{cell_id}` (cell.json), world size from the cell; the ranks start with torch.multiprocessing.spawn on gloo (nccl for CUDA).",
            "",
            "## Versions",
            "",
            f"- fails: torch {build}, git {recorded.git_version or 'unknown'}, CUDA {recorded.cuda_version or 'none'}, device {recorded.description or 'unknown'}",
            *(f"- passes: torch {version}" for version in passing),
            "",
            "## Environment",
            "",
            "```",
            *environment,
            "```",
            "",
            "`python -m torch.utils.collect_env` in full: collect_env.txt. Paths are relative to the run directory",
            "or the project that ran it.",
            "",
        ]
    )
