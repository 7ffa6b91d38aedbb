"""Bisecting a broken checkpoint direction, without installing anything: a fake release line in
which torch BASELINE cannot read the checkpoints of releases from FIRST_BAD on (a rollback break),
or a release from FIRST_BAD on cannot read BASELINE's (a forward break). Installs and `torchmatrix
run` are replaced by the fake, which answers each read from the writer and reader the step's
commands named, so what is checked is what the steps ask for: who writes, who reads, which venvs
are installed, and the release the search names."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.version import Version

from torchmatrix.bisect import command
from torchmatrix.bisect import steps as bisect_steps
from torchmatrix.bisect.command import BisectError, BisectRequest, regressions_of_run, run_bisect
from torchmatrix.bisect.directions import broken_directions
from torchmatrix.bisect.versions import between
from torchmatrix.env.torch_install import InstallResult
from torchmatrix.matrix.config import ReportSettings, load_matrix
from torchmatrix.matrix.selection import CellSelection
from torchmatrix.reports.records import RunResults, TestRecord
from torchmatrix.reports.run_reader import load_results
from torchmatrix.status import Confirmation

from helpers.matrix_files import REFERENCE_COMPONENTS, write_matrix
from helpers.report_runs import write_fixture_run

BASELINE = "2.13.0"
RELEASES = ["2.13.1", "2.13.2", "2.14.0", "2.14.1", "2.14.2", "2.15.0"]  # the index, between the pins
CELL, AXES = "ws1-none", {"world_size": "1", "fsdp": "none"}
WRITE = "cross_version::test_writes_checkpoint_for_other_versions"
ALONE = Confirmation.FAILS_ALONE


def newer(version: str, than: str) -> bool:
    return Version(version) >= Version(than)


def read_test(writer: str) -> str:
    return f"test_loads_checkpoint_written_by[writer={writer}]"


def results_of(tests: list[TestRecord], run_id: str = "run") -> RunResults:
    return RunResults(run_id, "", [], "", "", BASELINE, ReportSettings(), [], {CELL: AXES}, tests)


class FakeReleases:
    """Installs and step runs of a release line: `unreadable(writer, reader)` says which reads fail;
    `uninstallable` releases do not install; `unwritable` ones fail their write."""

    def __init__(self, unreadable, uninstallable=(), unwritable=()):
        self.unreadable, self.uninstallable, self.unwritable = unreadable, set(uninstallable), set(unwritable)
        self.installs: list[str] = []
        self.runs: dict[str, list[list[str]]] = {}
        self.from_run: RunResults | None = None

    def prepare_venv(self, matrix, envdir, version, logs):
        self.installs.append(version)
        venv = SimpleNamespace(python=Path(f"/venvs/{version}/bin/python"), location=Path(f"/venvs/{version}"))
        if version in self.uninstallable:
            return venv, InstallResult(False, "ERROR: No matching distribution found for torch"), False
        return venv, InstallResult(True), False

    def torchmatrix(self, steps, venv, version, run_id, arguments, step, begun):
        assert venv.python == Path(f"/venvs/{version}/bin/python"), "a side ran in another version's venv"
        self.runs.setdefault(run_id, []).append(arguments)

    def load_results(self, path: Path) -> RunResults:
        if path.name not in self.runs:
            return self.from_run
        tests, written = [], set()
        for arguments in self.runs[path.name]:
            torch = arguments[arguments.index("--torch") + 1]
            peers = [a.removeprefix("--peer=") for a in arguments if a.startswith("--peer=")]
            assert f"--only=world_size={AXES['world_size']}" in arguments, arguments
            if torch == "system":
                continue  # a step of the tests' search: no test of this release line fails
            if "--cross-version-reads" not in arguments:
                assert f"--test={WRITE}" in arguments and peers, arguments
                failed = torch in self.unwritable
                tests.append(TestRecord(torch, CELL, "cross_version", WRITE.split("::")[1],
                                        "failed" if failed else "passed", 1.0, "OSError: disk full" if failed else "",
                                        confirmation=ALONE if failed else None))  # fmt: skip
                written |= set() if failed else {torch}
                continue
            for writer in peers:
                if writer not in written:
                    tests.append(TestRecord(torch, CELL, "cross_version", read_test(writer), "skipped", 0.0,
                                            f"not checked: torch {writer} wrote no checkpoint"))  # fmt: skip
                elif self.unreadable(writer, torch):
                    tests.append(TestRecord(torch, CELL, "cross_version", read_test(writer), "failed", 1.0,
                                            f"RuntimeError: format of {writer} unreadable by {torch}", confirmation=ALONE))  # fmt: skip
                else:
                    tests.append(TestRecord(torch, CELL, "cross_version", read_test(writer), "passed", 1.0))
        return results_of(tests, path.name)

    def pairs(self) -> list[list[tuple[str, str]]]:
        """Each step's (writer, reader) pairs, as its commands asked for them."""
        steps = []
        for arguments_of_step in self.runs.values():
            reads = [a for a in arguments_of_step if "--cross-version-reads" in a]
            steps.append(
                [
                    (peer.removeprefix("--peer="), a[a.index("--torch") + 1])
                    for a in reads
                    for peer in a
                    if peer.startswith("--peer=")
                ]
            )
        return steps


@pytest.fixture
def project(tmp_path):
    path = write_matrix(
        tmp_path,
        torch=[BASELINE, "2.15.1"],
        axes={"world_size": [1], "fsdp": ["none"]},
        suites={"cross_version": {"path": None}},
        components=REFERENCE_COMPONENTS,
    )
    return load_matrix(str(path))


def bisect(monkeypatch, project, fake: FakeReleases, capsys, **request) -> tuple[int, list[str]]:
    monkeypatch.setattr(bisect_steps, "prepare_venv", fake.prepare_venv)
    monkeypatch.setattr(bisect_steps, "import_failure", lambda venv: "")
    monkeypatch.setattr(bisect_steps.Steps, "_torchmatrix", lambda own, *args: fake.torchmatrix(own, *args))
    monkeypatch.setattr(command, "load_results", fake.load_results)
    monkeypatch.setattr(bisect_steps, "load_results", fake.load_results)
    monkeypatch.setattr(command, "offered_versions", lambda matrix, good, bad: between(good, bad, RELEASES))
    root = project.root
    code = run_bisect(BisectRequest(matrix=project, envdir=root / ".nox", reports=root / "reports", **request))
    return code, capsys.readouterr().out.splitlines()


def bisect_from_run(
    monkeypatch, project, fake: FakeReleases, capsys, results: RunResults, run_dir: Path
) -> tuple[int, list[str]]:
    """`bisect --from run_dir`, a new directory whose results.json the fake reads as `results`."""
    fake.from_run = results
    run_dir.mkdir()
    return bisect(monkeypatch, project, fake, capsys, from_run=run_dir)


def bisect_the_pins(monkeypatch, project, fake: FakeReleases, capsys) -> tuple[int, list[str]]:
    """`bisect` from --good at the baseline to --bad 2.15.1, over the world_size=1 cells."""
    selection = CellSelection.parse(["world_size=1"], None, None, project.axes)
    return bisect(monkeypatch, project, fake, capsys, good=BASELINE, bad="2.15.1", cell_selection=selection)


def rollback_run(candidate: str = "2.15.0", *, confirmed: bool = True) -> RunResults:
    read = TestRecord(BASELINE, CELL, "cross_version", read_test(candidate), "failed", 1.0,
                      message="ValueError: too many values to unpack (expected 5)",
                      confirmation=ALONE if confirmed else None)  # fmt: skip
    return results_of([read])


@pytest.mark.parametrize("first_bad", [*RELEASES, "2.15.1"])
def test_a_rollback_search_writes_with_each_release_reads_with_the_baseline_and_installs_log2_releases(
    monkeypatch, project, capsys, tmp_path, first_bad
):
    fake = FakeReleases(lambda writer, reader: reader == BASELINE and newer(writer, first_bad))
    code, out = bisect_from_run(monkeypatch, project, fake, capsys, rollback_run("2.15.1"), tmp_path / "run")
    assert code == 0, out
    tried = [step for step in fake.pairs()]
    assert all(pairs == [(pairs[0][0], BASELINE)] for pairs in tried), tried  # each release wrote, the baseline read
    assert len(tried) <= math.ceil(math.log2(len(RELEASES) + 1))
    assert set(fake.installs) == {pairs[0][0] for pairs in tried} | {BASELINE}  # each once, the baseline once
    assert len(fake.installs) == len(tried) + 1
    last_good = [BASELINE, *RELEASES][[*RELEASES, "2.15.1"].index(first_bad)]
    assert out[-1] == (
        f"rollback [{CELL}] (torch {BASELINE} reading each release's checkpoint): first bad: {first_bad} "
        f"({last_good} passed) — "
        + (f"RuntimeError: format of {first_bad} unreadable by {BASELINE}" if first_bad != "2.15.1"
           else "ValueError: too many values to unpack (expected 5)")
    )  # fmt: skip


def test_a_forward_search_writes_with_the_baseline_and_reads_with_each_release(monkeypatch, project, capsys, tmp_path):
    fake = FakeReleases(lambda writer, reader: writer == BASELINE and newer(reader, "2.14.1"))
    forward = TestRecord("2.15.1", CELL, "cross_version", read_test(BASELINE), "failed", 1.0,
                         message="KeyError: 'optimizer.state'", confirmation=ALONE)  # fmt: skip
    code, out = bisect_from_run(monkeypatch, project, fake, capsys, results_of([forward]), tmp_path / "run")
    assert code == 0, out
    assert all(pairs == [(BASELINE, pairs[0][1])] for pairs in fake.pairs()), fake.pairs()
    assert out[-1].startswith(
        f"forward [{CELL}] (each release reading torch {BASELINE}'s checkpoint): first bad: 2.14.1 (2.14.0 passed)"
    )


def test_good_and_bad_pins_check_both_directions_first_then_search_the_broken_one(monkeypatch, project, capsys):
    fake = FakeReleases(lambda writer, reader: reader == BASELINE and newer(writer, "2.14.0"))
    code, out = bisect_the_pins(monkeypatch, project, fake, capsys)
    assert code == 0, out
    # cross_version is the matrix's only suite: no test to run on the pins, only both directions between them
    assert fake.pairs()[0] == [("2.15.1", BASELINE), (BASELINE, "2.15.1")]
    assert all(pairs == [(pairs[0][0], BASELINE)] for pairs in fake.pairs()[1:])
    assert "first bad: 2.14.0 (2.13.2 passed)" in out[-1] and out[-1].startswith("rollback"), out[-1]


def test_pins_whose_checkpoints_load_both_ways_are_refused_saying_so(monkeypatch, project, capsys):
    fake = FakeReleases(lambda writer, reader: False)
    with pytest.raises(BisectError, match=f"^every checkpoint between {BASELINE} and 2.15.1 loaded exactly both ways$"):
        bisect_the_pins(monkeypatch, project, fake, capsys)
    assert [a[a.index("--torch") + 1] for a in next(iter(fake.runs.values()))] == [
        "2.15.1",
        BASELINE,
        BASELINE,
        "2.15.1",
    ]
    with_tests = dataclasses.replace(project, suites={**project.suites, "demo": project.suites["cross_version"]})
    with pytest.raises(BisectError, match="nothing fails alone on --bad 2.15.1 .*; every checkpoint .* both ways"):
        bisect_the_pins(monkeypatch, with_tests, FakeReleases(lambda writer, reader: False), capsys)


def test_a_release_that_cannot_write_stops_the_search_with_the_writes_failure(monkeypatch, project, capsys, tmp_path):
    fake = FakeReleases(lambda writer, reader: reader == BASELINE and newer(writer, "2.15.0"), unwritable={"2.14.0"})
    code, out = bisect_from_run(monkeypatch, project, fake, capsys, rollback_run("2.15.1"), tmp_path / "run")
    assert code == 1, out
    assert (
        "no verdict: torch 2.14.0 no verdict (torch 2.14.0 could not write the checkpoint: OSError: disk full)"
        in out[-1]
    )


def test_a_release_that_does_not_install_is_stepped_around_and_the_baseline_must_install(
    monkeypatch, project, capsys, tmp_path
):
    fake = FakeReleases(lambda writer, reader: reader == BASELINE and newer(writer, "2.14.1"), uninstallable={"2.14.0"})
    code, out = bisect_from_run(monkeypatch, project, fake, capsys, rollback_run("2.15.1"), tmp_path / "run")
    assert code == 0, out
    assert (
        "first bad: one of 2.14.0, 2.14.1 (2.13.2 passed; 2.14.0 did not install: "
        "ERROR: No matching distribution found for torch)" in out[-1]
    ), out[-1]
    broken_baseline = FakeReleases(lambda writer, reader: True, uninstallable={BASELINE})
    (tmp_path / "run").rename(tmp_path / "run-before")  # the first bisect's report is there
    with pytest.raises(
        BisectError, match=f"torch {BASELINE}, the other side of every checkpoint this bisect reads, did not install"
    ):
        bisect_from_run(monkeypatch, project, broken_baseline, capsys, rollback_run("2.15.1"), tmp_path / "run")
    assert list((tmp_path / "run").iterdir()) == []  # a refusal leaves nothing behind


def test_a_runs_confirmed_broken_directions_are_searched_from_the_baseline(tmp_path):
    results = load_results(write_fixture_run(tmp_path / "project", versions=(BASELINE,)))
    rollback = dataclasses.replace(rollback_run("2.15.0").tests[0], cell="ws1-none")
    forward = TestRecord(
        "2.15.0", "ws1-none", "cross_version", read_test(BASELINE), "failed", 1.0, "E", confirmation=ALONE
    )
    unconfirmed = dataclasses.replace(rollback, test=read_test("2.14.1"), confirmation=None)
    run = dataclasses.replace(results, tests=[*results.tests, rollback, forward, unconfirmed])
    found = broken_directions(run, BASELINE)
    assert [(r.direction, r.good, r.bad, r.cell, r.axes) for r in found] == [
        ("rollback", BASELINE, "2.15.0", "ws1-none", {"world_size": "1", "fsdp": "none"}),
        ("forward", BASELINE, "2.15.0", "ws1-none", {"world_size": "1", "fsdp": "none"}),
    ]
    assert [r.direction for r in regressions_of_run(run)] == ["rollback", "forward"]
    with pytest.raises(BisectError, match="no confirmed regression or broken checkpoint direction"):
        regressions_of_run(dataclasses.replace(results, tests=[*results.tests, unconfirmed]))
