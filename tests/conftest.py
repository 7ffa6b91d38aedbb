"""Shared helpers for the runner's tests: a throwaway project with its own matrix.toml and suites."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# For a throwaway matrix.toml whose suites/ links to this checkout's: suites may resolve into it.
PROJECT_IS_THIS_CHECKOUT = f"\n[project]\nroot = {json.dumps(str(REPO))}\n"


def checkout_env(*also: Path | None) -> dict[str, str]:
    """The environment with this checkout importable, as an installed torchmatrix would be, and the
    directories `also` (a user's component modules)."""
    paths = [str(path) for path in also if path] + [str(REPO), os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def unconstrained_pip(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` for a test's own pip installs: the user's pip constraints (pip.conf's `constraint`,
    PIP_CONSTRAINT) lifted, since a configured `torch<=X` cap refuses the releases and wheels a test
    installs; the index settings stay, so the installs still find torch where the user's pip does."""
    return {**environ, "PIP_CONSTRAINT": os.devnull}


# The reference components the resume suite needs (matrix.toml's, without batch and TE).
REFERENCE_COMPONENTS = {
    "model": "torchmatrix.models.transformer:build_model",
    "parallelize": "torchmatrix.models.parallel:parallelize",
    "optimizer_adamw": "torchmatrix.models.optim:build_adamw",
    "optimizer_precision_aware": "torchmatrix.models.optim:build_precision_aware",
    "checkpointer": "torchmatrix.models.checkpoint:Checkpointer",
    "dataset": "torchmatrix.models.data:TokenDataset",
}


def matrix_toml(
    *,
    axes: Mapping[str, Sequence[object]],
    suites: Mapping[str, Mapping[str, object]],
    torch: Sequence[str] = ("system",),
    baseline: str | None = None,
    exclude: Sequence[Mapping[str, object]] = (),
    components: Mapping[str, str] | None = None,
    report: Mapping[str, object] | None = None,
) -> str:
    """matrix.toml text for a throwaway project, so a test states only what its matrix is about.

    A suite's `path` defaults to suites/test_<name>.py (`"path": None` leaves it out: the built-in
    suite of that name); a nested mapping (a suite's `options`) becomes its own table. Tests about malformed or hostile text write that text literally instead.
    """
    lines = _toml_table("torch", {"versions": list(torch), **({"baseline": baseline} if baseline else {})})
    lines += _toml_table("axes", axes)
    for rule in exclude:
        lines += _toml_table("exclude", rule, array=True)
    for name, suite in suites.items():
        table = {"path": f"suites/test_{name}.py", **suite}
        lines += _toml_table(f"suites.{name}", {key: value for key, value in table.items() if value is not None})
    if components:
        lines += _toml_table("components", components)
    if report:
        lines += _toml_table("report", report)
    return "\n".join(lines)


def write_matrix(root: Path, **sections) -> Path:
    """Write `matrix_toml(**sections)` to root/matrix.toml and return its path."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "matrix.toml"
    path.write_text(matrix_toml(**sections))
    return path


def write_demo_project(root: Path, **sections) -> Path:
    """A project at root whose one suite, `demo`, is a single trivial test, with matrix.toml from
    `sections` (`suites` defaults to just that one); returns root."""
    (root / "suites").mkdir(parents=True, exist_ok=True)
    (root / "suites" / "test_demo.py").write_text("def test_x(cell):\n    pass\n")
    write_matrix(root, **{"suites": {"demo": {}}, **sections})
    return root


def _toml_table(name: str, values: Mapping[str, object], array: bool = False) -> list[str]:
    """One TOML table (JSON spells its strings, numbers, booleans and lists as TOML does), then its subtables."""
    nested = {key: value for key, value in values.items() if isinstance(value, Mapping)}
    lines = [f"[[{name}]]" if array else f"[{name}]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in values.items() if key not in nested]
    lines.append("")
    for key, value in nested.items():
        lines += _toml_table(f"{name}.{key}", value)
    return lines


class Project:
    """A temporary project directory: matrix.toml plus suite files, run through the real CLI."""

    def __init__(self, root: Path):
        self.root = root
        (root / "suites").mkdir(parents=True, exist_ok=True)

    def write(self, relative: str, text: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    def torchmatrix(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """Run `python -m torchmatrix ARGS` in the project directory."""
        return subprocess.run(
            [sys.executable, "-m", "torchmatrix", *args],
            cwd=self.root,
            env=checkout_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def cell_outcomes(version_dir: Path) -> dict[str, dict[str, str]]:
    """Per cell id, test name -> "passed", "failure", "error" or "skipped", from a run's per-cell JUnit."""
    from junitparser import JUnitXml

    from torchmatrix.reports.junit import test_of_testcase

    outcomes = {}
    for report in sorted(version_dir.glob("*.xml")):
        outcomes[report.stem] = {
            test_of_testcase(case.name): type(case.result[0]).__name__.lower() if case.result else "passed"
            for suite in JUnitXml.fromfile(str(report))
            for case in suite
        }
    return outcomes


def cell_failures(version_dir: Path) -> dict[str, dict[str, str]]:
    """Per cell id, test name -> failure message and text, for the tests that failed."""
    from junitparser import Failure, JUnitXml

    from torchmatrix.reports.junit import test_of_testcase

    return {
        report.stem: {
            test_of_testcase(case.name): f"{case.result[0].message or ''}\n{case.result[0].text or ''}"
            for suite in JUnitXml.fromfile(str(report))
            for case in suite
            if case.result and isinstance(case.result[0], Failure)
        }
        for report in sorted(version_dir.glob("*.xml"))
    }


def run_suites(
    root: Path, matrix_text: str, components_from: Path | None = None, *, tests: Sequence[str] = ()
) -> tuple[subprocess.CompletedProcess, dict[str, dict[str, str]]]:
    """Run this checkout's suites over `matrix_text` (a throwaway project at `root`, its components
    importable from `components_from` too) with `python -m torchmatrix run --torch system`, only
    `tests` (`suite::test[params]`) where given; return the process and `cell_outcomes` of the run."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "suites").symlink_to(REPO / "suites", target_is_directory=True)
    (root / "matrix.toml").write_text(matrix_text + PROJECT_IS_THIS_CHECKOUT)
    # Mutants fail for a known reason; re-running each failure alone would only double the time.
    command = ["run", "--torch", "system", "--config", str(root / "matrix.toml"), "--reports", str(root / "reports")]
    command += ["--confirm-limit", "0", *(argument for test in tests for argument in ("--test", test))]
    done = subprocess.run(
        [sys.executable, "-m", "torchmatrix", *command],
        cwd=REPO,
        env=checkout_env(components_from),
        capture_output=True,
        text=True,
        timeout=900,
    )
    return done, cell_outcomes(root / "reports" / "latest" / "torch-system")


def processes_with(marker: str) -> list[int]:
    """Live processes (not zombies) other than this one whose environment carries `marker`: every
    process a run starts inherits it (the runner, pytest, zygote, ranks)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if int(entry.name) != os.getpid() and marker.encode() in (entry / "environ").read_bytes():
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture
def project(tmp_path) -> Project:
    return Project(tmp_path / "project")


def copy_checkout(destination: Path) -> Path:
    """The files git knows (tracked and new, not ignored) of this checkout, so no build artefact travels."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.exists() or source.is_symlink():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name, follow_symlinks=False)
    return destination
