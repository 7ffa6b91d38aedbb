"""`bisect --good nightly-A --bad nightly-B`: the dated builds between two nightly dates, searched by
date, ending on the commit range for upstream (each build's torch.version.git_version). Builds are
fakes: a step's run is recorded and its results made up, as test_bisect_failures.py does."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from torchmatrix.bisect import command
from torchmatrix.bisect import steps as bisect_steps
from torchmatrix.bisect.command import BisectRequest, run_bisect
from torchmatrix.bisect.versions import VersionError, between
from torchmatrix.env.devices import Environment
from torchmatrix.env.torch_install import InstallResult
from torchmatrix.matrix.config import ReportSettings, load_matrix
from torchmatrix.reports.records import RunResults, TestRecord, VersionInfo
from torchmatrix.status import Confirmation

from helpers.matrix_files import write_demo_project

LISTED = [f"2.16.0.dev202612{day:02d}+cpu" for day in range(1, 9)]
FIRST_BAD = "nightly-20261205"


def sha(value: str) -> str:
    return hashlib.sha1(value.encode()).hexdigest()


class DatedBuilds:
    """Nightlies whose demo test fails from FIRST_BAD on; each step's run recorded by its build."""

    def __init__(self):
        self.installed: list[str] = []

    def prepare_venv(self, matrix, envdir, version, logs):
        self.installed.append(version)
        location = Path(f"/venvs/{version}")
        venv = SimpleNamespace(python=location / "bin" / "python", location=location, environment=dict)
        return venv, InstallResult(True), False

    def load_results(self, path: Path) -> RunResults:
        value = path.name.split("-torch-")[1]
        bad = value >= FIRST_BAD
        record = TestRecord("system", "ws1", "demo", "test_x", "failed" if bad else "passed", 1.0,
                            "AssertionError: planted" if bad else "",
                            confirmation=Confirmation.FAILS_ALONE if bad else None)  # fmt: skip
        info = VersionInfo("system", Environment.recorded(f"{value}+cpu", sha(value)))
        return RunResults(path.name, "", [], "", "", "system", ReportSettings(), [info], {"ws1": {}}, [record])


def test_a_bisect_between_two_dates_ends_on_the_commit_range(monkeypatch, tmp_path, capsys):
    project = write_demo_project(tmp_path / "project", torch=["2.13.0"], axes={"world_size": [1]})
    fake = DatedBuilds()
    monkeypatch.setattr(bisect_steps, "prepare_venv", fake.prepare_venv)
    monkeypatch.setattr(bisect_steps, "import_failure", lambda venv: "")
    monkeypatch.setattr(bisect_steps, "run_step_process", lambda arguments, env: 0)
    monkeypatch.setattr(command, "load_results", fake.load_results)
    monkeypatch.setattr(bisect_steps, "load_results", fake.load_results)
    monkeypatch.setattr(command, "offered_versions", lambda matrix, good, bad: between(good, bad, LISTED))
    request = BisectRequest(
        matrix=load_matrix(project / "matrix.toml"),
        envdir=tmp_path / ".nox",
        reports=tmp_path / "reports",
        good="nightly-20261201",
        bad="nightly-20261208",
    )
    assert run_bisect(request) == 0
    out = capsys.readouterr().out.splitlines()
    assert fake.installed[:2] == ["nightly-20261208", "nightly-20261201"]  # the pins, then by date
    assert len(fake.installed) == 2 + 3  # six dates between them: three steps
    good, bad = sha("nightly-20261204"), sha(FIRST_BAD)
    assert any("first bad: nightly-20261205 (nightly-20261204 passed)" in line for line in out), out
    assert out[-1] == (
        f"commit range for upstream: nightly-20261204 is {good}, nightly-20261205 is {bad}: "
        f"https://github.com/pytorch/pytorch/compare/{good}...{bad}"
    )
    (report,) = (tmp_path / "reports").glob("bisect-*/bisect.md")
    assert f"/compare/{good}...{bad}" in report.read_text()


@pytest.mark.parametrize(
    ("good", "bad", "says"),
    [
        ("nightly-20261201", "2.16.0", "a bisect by date takes two dated nightlies"),
        ("nightly-20261203", "nightly-20261201", "--good nightly-20261203 is not older than --bad nightly-20261201"),
    ],
)
def test_pins_that_are_not_two_dates_in_order_are_refused(good, bad, says):
    with pytest.raises(VersionError, match=says):
        between(good, bad, LISTED)
