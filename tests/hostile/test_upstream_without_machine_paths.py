"""What goes upstream carries no machine paths (issue 61 item 16): a failure's message, traceback and
output as junit.xml, results.json, summary.html and bisect's verdicts show them name paths relative
to the run directory or the project, the matrix in summary.html's header relative to the run, and the
reproducer's README gives both sides' torch build, git version and a short environment block."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from torchmatrix.bisect.command import verdict_line
from torchmatrix.bisect.regression import Regression
from torchmatrix.bisect.search import Bisection, Outcome
from torchmatrix.env.devices import Environment
from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.config import Suite
from torchmatrix.matrix.plan import plan_runs
from torchmatrix.messages.events import TestOutcome
from torchmatrix.reports import junit
from torchmatrix.reports.machine_paths import without_machine_paths
from torchmatrix.reports.records import TestRecord, VersionInfo
from torchmatrix.reports.report import write_report
from torchmatrix.reports.results_json import write_json
from torchmatrix.reports.run_reader import load_results
from torchmatrix.status import Confirmation

from helpers.checkout import checkout_env
from helpers.report_runs import BASELINE, CANDIDATE, write_fixture_run

CELL = Cell({"world_size": 1, "fsdp": "none"})
SUITE = Suite("alpha", "suites/test_alpha.py", 60.0, ("world_size", "fsdp"))


def failing_cell(run_dir: Path, project: Path) -> None:
    """One cell whose failure names the suite's file, the run's checkpoint folder and a file under home."""
    checkpoint = run_dir / f"torch-{CANDIDATE}" / "checkpoints" / CELL.id / "model.pt"
    message = f"FileNotFoundError: [Errno 2] No such file or directory: '{checkpoint}'"
    text = f'  File "{project}/suites/test_alpha.py", line 3, in test_load\n{message}\n'
    home_file = Path.home() / ".cache" / "torchmatrix" / "wheels" / "x.whl"
    (run,) = plan_runs([CELL], {"alpha": SUITE})
    outcome = TestOutcome("alpha", "test_load", "failed", 1.0, message, text, stderr=f"reading {home_file}\n")
    outcome.confirmation = Confirmation.FAILS_ALONE
    version_dir = run_dir / f"torch-{CANDIDATE}"
    junit.write_cell(version_dir, CANDIDATE, Environment(torch=f"{CANDIDATE}+cpu"), CELL, [(run, outcome)], 0, project)


def test_junit_results_json_and_summary_html_name_no_machine_path(tmp_path):
    project = tmp_path / "project"
    run_dir = write_fixture_run(project)
    failing_cell(run_dir, project)
    write_report(run_dir)
    record = next(r for r in load_results(run_dir).tests if r.test == "test_load")
    assert record.message == (
        f"FileNotFoundError: [Errno 2] No such file or directory: 'torch-{CANDIDATE}/checkpoints/{CELL.id}/model.pt'"
    )
    assert 'File "suites/test_alpha.py", line 3' in record.text
    for name in ("junit.xml", "results.json", "summary.html", "summary.md"):
        written = (run_dir / name).read_text()
        assert str(tmp_path) not in written, name
        assert str(Path.home()) not in written, name
    assert "matrix <code>../../matrix.toml</code>" in (run_dir / "summary.html").read_text()
    assert "~/.cache/torchmatrix/wheels/x.whl" in (run_dir / "junit.xml").read_text()


def test_a_bisect_verdict_names_the_run_relative_path(tmp_path):
    out = tmp_path / "reports" / "run" / "bisect-1"
    cause = f"RuntimeError: cannot open {out}/steps/step1-torch-2.95.0/torch-system/checkpoints/ws1"
    regression = Regression("alpha", "test_load", "ws1", {"world_size": "1"}, "2.93.0", "2.96.0", cause)
    search = Bisection("2.93.0", "2.96.0", ["2.94.0", "2.95.0"])
    search.record("2.95.0", Outcome.FAILS, cause)
    search.record("2.94.0", Outcome.PASSED)
    line = without_machine_paths(verdict_line(regression, search), out, tmp_path)
    assert line.endswith("— RuntimeError: cannot open steps/step1-torch-2.95.0/torch-system/checkpoints/ws1"), line


def test_the_cross_version_readme_gives_both_sides_build_git_and_environment(tmp_path):
    project = tmp_path / "project"
    results = load_results(write_fixture_run(project))
    read = f"test_loads_checkpoint_written_by[writer={CANDIDATE}]"
    message = f"RuntimeError: {project}/reports/with-read/torch-{CANDIDATE}/checkpoints/ws1-none: format 2"
    record = TestRecord(BASELINE, "ws1-none", "cross_version", read, "failed", 1.0, message=message,
                        confirmation=Confirmation.FAILS_ALONE)  # fmt: skip
    versions = [
        VersionInfo(BASELINE, Environment.recorded("2.13.0+cpu", "aaa111")),
        VersionInfo(CANDIDATE, Environment("2.14.1+cu126", "bbb222", "12.6", gpu_count=2, gpu_name="NVIDIA H100")),
    ]
    run = project / "reports" / "with-read"
    run.mkdir(parents=True)
    write_json(run / "results.json", dataclasses.replace(results, tests=[record], versions=versions), [])
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "torchmatrix", "repro", str(run), f"{BASELINE}/ws1-none/cross_version::{read}",
         "--out", str(out), "--python", sys.executable, "--writer-python", sys.executable],
        cwd=project, env=checkout_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    readme = (out / "README.md").read_text()
    assert "- writes: torch 2.14.1+cu126, git bbb222, CUDA 12.6, device cuda (2x NVIDIA H100, CUDA 12.6)" in readme
    assert "- fails to read it: torch 2.13.0+cpu, git aaa111, CUDA none, device cpu (ranks simulated" in readme
    import torch

    for side in ("writing", "reading"):
        block = readme.split(f"## Environment of the {side} torch")[1].split("```")[1]
        assert f"torch: {torch.__version__}, git {torch.version.git_version}" in block
        assert f"python: {sys.version.split()[0]}" in block and "OS: " in block and "CPU: " in block
        assert "GPU: " in block and "CUDA: " in block and "packages: " in block
    assert f"torch-{CANDIDATE}/checkpoints/ws1-none: format 2" in readme
    for path in out.iterdir():
        text = path.read_text()
        assert str(tmp_path) not in text and str(Path.home()) not in text, (path.name, text)
    assert json.loads((out / "cell.json").read_text())["id"] == "ws1-none"
