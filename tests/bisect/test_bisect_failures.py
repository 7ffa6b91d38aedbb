"""`bisect --from RUN` searches once per distinct failure (issue 61 item 17): seven cells whose
baseline cannot read the candidate's checkpoint for the same root cause cost the steps of one
search, each step writing and reading every one of the seven cells, and the verdict is printed once;
a cell that breaks at another release splits off and gets its own verdict. Releases are fakes: a
step's runs are recorded and its results made up, as tests/bisect/test_bisect_directions.py does."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

from packaging.version import Version

from torchmatrix.bisect import command
from torchmatrix.bisect import steps as bisect_steps
from torchmatrix.bisect.command import BisectRequest, run_bisect
from torchmatrix.bisect.versions import between
from torchmatrix.env.torch_install import InstallResult
from torchmatrix.matrix.config import ReportSettings, load_matrix
from torchmatrix.matrix.selection import KeywordExpression
from torchmatrix.reports.closing import run_closing_lines
from torchmatrix.reports.records import RunResults, TestRecord
from torchmatrix.status import Confirmation

from helpers.matrix_files import REFERENCE_COMPONENTS, write_matrix

BASELINE, CANDIDATE = "2.13.0", "2.15.1"
RELEASES = ["2.13.1", "2.13.2", "2.14.0", "2.14.1", "2.14.2", "2.15.0"]
SEEDS = list(range(1, 8))
CELLS = {f"ws1-{seed}": {"world_size": "1", "seed": str(seed)} for seed in SEEDS}
WRITE_TEST = "test_writes_checkpoint_for_other_versions"
ALONE = Confirmation.FAILS_ALONE


def read_test(writer: str) -> str:
    return f"test_loads_checkpoint_written_by[writer={writer}]"


def cause(writer: str) -> str:
    return f"RuntimeError: format of torch {writer} is unreadable"


class SevenCells:
    """A release line where torch `first_bad[cell]` and later write checkpoints the baseline cannot read."""

    def __init__(self, first_bad: dict[str, str]):
        self.first_bad = first_bad
        self.runs: dict[str, list[list[str]]] = {}
        self.from_run = RunResults(
            "run", "", [], "", "", BASELINE, ReportSettings(), [], CELLS,
            [TestRecord(BASELINE, cell, "cross_version", read_test(CANDIDATE), "failed", 1.0, cause(CANDIDATE),
                        confirmation=ALONE) for cell in CELLS],
        )  # fmt: skip

    def prepare_venv(self, matrix, envdir, version, logs):
        return venv_of(version), InstallResult(True), version == BASELINE  # the baseline's was installed before

    def run_step_process(self, arguments: list[str], env: dict) -> int:
        """A step's `torchmatrix run`, recorded: it must not print the run's report command."""
        assert "--no-report-hint" in arguments, arguments
        self.runs.setdefault(arguments[arguments.index("--run-id") + 1], []).append(arguments)
        return 0

    def cells_of(self, arguments: list[str]) -> list[str]:
        if "-k" not in arguments:
            return [cell for cell, axes in CELLS.items() if f"--only=seed={axes['seed']}" in arguments]
        expression = KeywordExpression(arguments[arguments.index("-k") + 1])
        return [cell for cell in CELLS if expression.matches(cell)]

    def load_results(self, path: Path) -> RunResults:
        if path.name not in self.runs:
            return self.from_run
        tests = []
        for arguments in self.runs[path.name]:
            torch = arguments[arguments.index("--torch") + 1]
            peers = [a.removeprefix("--peer=") for a in arguments if a.startswith("--peer=")]
            for cell in self.cells_of(arguments):
                if "--cross-version-reads" not in arguments:
                    tests.append(TestRecord(torch, cell, "cross_version", WRITE_TEST, "passed", 1.0))
                    continue
                for writer in peers:
                    broken = Version(writer) >= Version(self.first_bad[cell])
                    tests.append(TestRecord(torch, cell, "cross_version", read_test(writer),
                                            "failed" if broken else "passed", 1.0, cause(writer) if broken else "",
                                            confirmation=ALONE if broken else None))  # fmt: skip
        return RunResults(path.name, "", [], "", "", BASELINE, ReportSettings(), [], CELLS, tests)


def venv_of(version: str) -> SimpleNamespace:
    location = Path(f"/venvs/{version}")
    return SimpleNamespace(python=location / "bin" / "python", location=location, environment=dict)


def bisect(monkeypatch, tmp_path, capsys, fake: SevenCells) -> tuple[int, list[str], Path]:
    matrix = load_matrix(
        str(
            write_matrix(
                tmp_path,
                torch=[BASELINE, CANDIDATE],
                axes={"world_size": [1], "seed": SEEDS},
                suites={"cross_version": {"path": None}},
                components=REFERENCE_COMPONENTS,
            )
        )
    )
    monkeypatch.setattr(bisect_steps, "prepare_venv", fake.prepare_venv)
    monkeypatch.setattr(bisect_steps, "import_failure", lambda venv: "")
    monkeypatch.setattr(bisect_steps, "run_step_process", fake.run_step_process)
    monkeypatch.setattr(command, "load_results", fake.load_results)
    monkeypatch.setattr(bisect_steps, "load_results", fake.load_results)
    monkeypatch.setattr(command, "offered_versions", lambda matrix, good, bad: between(good, bad, RELEASES))
    run = tmp_path / "run"
    run.mkdir()
    request = BisectRequest(matrix=matrix, envdir=tmp_path / ".nox", reports=tmp_path / "reports", from_run=run)
    code = run_bisect(request)
    (out,) = run.glob("bisect-*")
    return code, capsys.readouterr().out.splitlines(), out


def test_seven_cells_broken_the_same_way_are_one_search_checking_every_cell(monkeypatch, tmp_path, capsys):
    fake = SevenCells({cell: "2.14.1" for cell in CELLS})
    code, out, report = bisect(monkeypatch, tmp_path, capsys, fake)
    assert code == 0, out
    assert len(fake.runs) <= math.ceil(math.log2(len(RELEASES) + 1)) == 3  # was 7 searches of up to 3 steps
    for arguments_of_step in fake.runs.values():
        for arguments in arguments_of_step:
            assert fake.cells_of(arguments) == list(CELLS), arguments  # each step writes and reads all seven
    verdicts = [line for line in out if "first bad" in line]
    assert verdicts == [
        f"rollback [{', '.join(CELLS)}] (torch {BASELINE} reading each release's checkpoint): "
        f"first bad: 2.14.1 (2.14.0 passed) — {cause('2.14.1')}"
    ]
    markdown = (report / "bisect.md").read_text()
    assert "| reused |" not in markdown.split("| step |")[1].splitlines()[2]  # the first step installed its release
    steps = json.loads((report / "bisect.json").read_text())["steps"]
    assert all(step["installed"] is True for step in steps)


def test_a_cell_that_breaks_at_another_release_splits_off_with_its_own_verdict(monkeypatch, tmp_path, capsys):
    fake = SevenCells({**{cell: "2.14.1" for cell in CELLS}, "ws1-7": "2.13.2"})
    code, out, _ = bisect(monkeypatch, tmp_path, capsys, fake)
    assert code == 0, out
    verdicts = [line for line in out if "first bad" in line]
    six = ", ".join(cell for cell in CELLS if cell != "ws1-7")
    assert sorted(verdicts) == sorted(
        [
            f"rollback [{six}] (torch {BASELINE} reading each release's checkpoint): "
            f"first bad: 2.14.1 (2.14.0 passed) — {cause('2.14.1')}",
            f"rollback [ws1-7] (torch {BASELINE} reading each release's checkpoint): "
            f"first bad: 2.13.2 (2.13.1 passed) — {cause('2.13.2')}",
        ]
    )


def test_a_bisect_steps_run_names_no_report_command(tmp_path):
    quiet = run_closing_lines(tmp_path, failed=False, report_hint=False)
    assert "summary.md" not in quiet and "report" not in quiet
    assert "write summary.md and summary.html with" in run_closing_lines(tmp_path, failed=False)


def test_a_reused_venv_reads_reused_in_the_table(monkeypatch, tmp_path, capsys):
    fake = SevenCells({cell: "2.14.1" for cell in CELLS})
    monkeypatch.setattr(
        fake,
        "prepare_venv",
        lambda matrix, envdir, version, logs: (venv_of(version), InstallResult(True), True),
    )
    _, _, report = bisect(monkeypatch, tmp_path, capsys, fake)
    rows = (report / "bisect.md").read_text().split("|---|---|---|---|---|\n")[1].splitlines()
    assert rows and all(row.split(" | ")[2] == "reused" for row in rows), rows
