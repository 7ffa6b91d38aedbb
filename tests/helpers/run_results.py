"""Whole `torchmatrix run`s of this checkout's suites, and what each cell's JUnit says of them."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from helpers.checkout import PROJECT_IS_THIS_CHECKOUT, REPO, checkout_env


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
    root: Path,
    matrix_text: str,
    components_from: Path | None = None,
    *,
    tests: Sequence[str] = (),
    timeout: float = 900,
) -> tuple[subprocess.CompletedProcess, dict[str, dict[str, str]]]:
    """Run this checkout's suites over `matrix_text` (a throwaway project at `root`, its components
    importable from `components_from` too) with `python -m torchmatrix run --torch system`, only
    `tests` (`suite::test[params]`) where given, within `timeout` seconds; return the process and
    `cell_outcomes` of the run."""
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
        timeout=timeout,
    )
    return done, cell_outcomes(root / "reports" / "latest" / "torch-system")


def run_and_read(root: Path, matrix_text: str, components_from: Path | None = None):
    """`run_suites`, then what a mutant module asserts on: the process, each cell's outcomes, each
    cell's failure texts, and the merged JUnit."""
    from junitparser import JUnitXml

    done, outcomes = run_suites(root, matrix_text, components_from=components_from)
    latest = root / "reports" / "latest"
    return done, outcomes, cell_failures(latest / "torch-system"), JUnitXml.fromfile(str(latest / "junit.xml"))


def cell_properties(junit, cell: str) -> dict[str, str]:
    """The JUnit properties of the first cell whose suite name contains `cell`, by their last `::` part."""
    suite = next(suite for suite in junit if cell in suite.name)
    return {prop.name.rpartition("::")[2]: prop.value for prop in suite.properties()}
