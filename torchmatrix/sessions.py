"""The bodies of the nox sessions; noxfile.py only declares them.

Every gpu_matrix session of one nox invocation writes into one run directory, so the report
session finds all torch versions side by side. A torch that fails to install still produces a
report: its cells are recorded as errors carrying pip's output.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from torchmatrix.config import ConfigError, Matrix, load_matrix

PROJECT = Path(__file__).resolve().parent.parent


def matrix_or_exit(path: str) -> Matrix:
    """Load matrix.toml for the noxfile; a bad file ends nox with one line and exit code 2."""
    try:
        return load_matrix(path)
    except ConfigError as error:
        print(f"torchmatrix: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def gpu_matrix(session, matrix: Matrix, torch_version: str, run_id: str) -> None:
    """Install torch==V and this project into the session's venv, then run V's cells."""
    import nox

    session.install("-e", str(PROJECT))
    reports = matrix.root / "reports"
    run = [
        "python",
        "-m",
        "torchmatrix",
        "run",
        "--config",
        str(matrix.path),
        "--torch",
        torch_version,
        "--run-id",
        run_id,
        "--reports",
        str(reports),
    ]
    session.notify("report", [str(reports / run_id)])
    install_log = reports / run_id / f"torch-{torch_version}" / "logs" / "install.log"
    install_log.parent.mkdir(parents=True, exist_ok=True)
    with open(install_log, "w") as log:
        try:
            session.install(f"torch=={torch_version}", "numpy", silent=False, stdout=log, stderr=subprocess.STDOUT)
        except nox.command.CommandFailed:
            failed = True
        else:
            failed = False
    if failed:
        session.run(*run, "--install-log", str(install_log), *session.posargs, success_codes=[0, 1])
        session.error(f"torch=={torch_version} did not install; its cells are reported as errors (see {install_log})")
    session.run(*run, *session.posargs)


def hf_llama_matrix() -> Matrix:
    """examples/hf_llama/matrix.toml: the suites on a tiny Hugging Face Llama."""
    return matrix_or_exit(str(PROJECT / "examples" / "hf_llama" / "matrix.toml"))


def hf_matrix(session, torch_version: str, run_id: str) -> None:
    """gpu_matrix over the Hugging Face example, with transformers installed and the project on
    PYTHONPATH (its components live in examples/ and models/, which are not installed)."""
    session.install("transformers")
    session.env["PYTHONPATH"] = str(PROJECT)
    gpu_matrix(session, hf_llama_matrix(), torch_version, run_id)


def report(session) -> None:
    """Write a run directory's reports (default: reports/latest); with `-- --compare RUN`, diff it against RUN."""
    parser = argparse.ArgumentParser(prog="nox -s report --")
    parser.add_argument("run_dir", nargs="?", default=str(PROJECT / "reports" / "latest"))
    parser.add_argument("--compare", metavar="RUN", help="a reference run directory or results.json")
    args = parser.parse_args(session.posargs)
    session.install("-e", str(PROJECT))
    session.run("python", "-m", "torchmatrix", "report", args.run_dir)
    if args.compare:
        session.run("python", "-m", "torchmatrix", "compare", args.compare, args.run_dir)


def merge(session) -> None:
    """Merge report directories (shards, jobs, versions): `nox -s merge -- DIR... --out DIR`."""
    session.install("-e", str(PROJECT))
    session.run("python", "-m", "torchmatrix", "merge", *session.posargs)


def tests(session, torch_version: str) -> None:
    """The project's own tests, in parallel with pytest-xdist, against the baseline torch."""
    torch = [] if torch_version == "system" else [f"torch=={torch_version}", "numpy"]
    session.install("-e", f"{PROJECT}[test]", *torch)
    session.run("python", "-m", "pytest", "-n", "auto", *session.posargs)


def lint(session) -> None:
    """ruff's lint rules and formatting over the whole project (config in pyproject.toml)."""
    session.install("ruff")
    session.run("ruff", "check", str(PROJECT))
    session.run("ruff", "format", "--check", str(PROJECT))
