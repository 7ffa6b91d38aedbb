"""A nightly or rc candidate is reported apart from the pin bump's verdict, with its build's git
commit, and its failures fail an exit code only where `[report] prerelease_blocks` or
`--prerelease-blocks` says so."""

from __future__ import annotations

from dataclasses import replace

import pytest

from torchmatrix.commands.merge import failed_versions
from torchmatrix.commands.report import report_run
from torchmatrix.env.devices import Environment
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.config import ReportSettings
from torchmatrix.reports import summary_html, summary_md
from torchmatrix.reports.prerelease import merged_exit, run_exit, with_flag
from torchmatrix.reports.records import RunResults, TestRecord, VersionInfo
from torchmatrix.reports.results_json import read_json, write_json
from torchmatrix.reports.upgrade_diff import upgrade_diffs
from torchmatrix.status import Confirmation

from helpers.report_runs import BASELINE, CANDIDATE, outcomes, write_project, write_version

NIGHTLY_GIT = "14e207be27fbb95392f1e0ea03df9f7625996f9d"


def run(settings: ReportSettings) -> RunResults:
    """2.13.0 passes; 2.14.1 passes; the nightly fails alone."""
    versions = [
        VersionInfo("2.13.0", Environment.recorded("2.13.0+cpu", "cf30153c4c131c8164ee7798e5022d810682e2cb")),
        VersionInfo("nightly", Environment.recorded("2.16.0.dev20261202+cpu", NIGHTLY_GIT)),
        VersionInfo("2.14.1", Environment.recorded("2.14.1+cpu", "5ac3a6a")),
    ]
    records = [TestRecord(v.torch, "ws1", "s", "t", "passed", 1.0) for v in versions if v.torch != "nightly"]
    records.append(
        TestRecord(
            "nightly", "ws1", "s", "t", "failed", 1.0, "AssertionError: x", confirmation=Confirmation.FAILS_ALONE
        )
    )
    return RunResults("run", "", [], "", "", "2.13.0", settings, versions, {"ws1": {}}, records)


def test_a_nightly_is_a_check_apart_from_the_bumps_verdict_with_its_commit():
    results = run(ReportSettings())
    bump, nightly = upgrade_diffs(results)  # pin bumps first, whatever order the run lists them in
    assert (bump.after, bump.fails, bump.blocks) == ("2.14.1", False, True)
    assert (nightly.after, nightly.fails, nightly.blocks) == ("nightly", True, False)
    markdown = summary_md.render(results, [bump, nightly])
    verdict, check = markdown.split("### Verdict `2.13.0` → `2.14.1`")[1].split(
        "### Pre-release check `2.13.0` → `nightly`"
    )
    assert "✅ 0 regressions of 2.14.1" in verdict and "❌ 1 regression of nightly" in check
    assert check.lstrip().startswith(
        "nightly is a pre-release build, reported apart from the pin bump's verdict: its failures do not block "
        "(set [report] prerelease_blocks = true or pass --prerelease-blocks to make them block)"
    )
    assert f"| `nightly` | `2.16.0.dev20261202+cpu` (git `{NIGHTLY_GIT}`) |" in markdown
    html = summary_html.render(results, [bump, nightly])
    assert "Pre-release check <code>2.13.0</code> → <code>nightly</code>" in html
    assert f"git <code>{NIGHTLY_GIT}</code>" in html


def test_the_setting_makes_a_nightly_block(tmp_path):
    results = run(ReportSettings(prerelease_blocks=True))
    _, nightly = upgrade_diffs(results)
    assert nightly.blocks and "its failures block ([report] prerelease_blocks)" in nightly.prerelease_note
    write_json(tmp_path / "results.json", results, [])
    back = read_json(tmp_path / "results.json")
    assert back.settings.prerelease_blocks is True and back.version("nightly").environment.git_version == NIGHTLY_GIT


@pytest.mark.parametrize(
    ("version", "blocks", "flag", "code"),
    [
        ("nightly", False, False, ExitCode.PASSED),
        ("nightly-20261202", False, True, ExitCode.FAILED),
        ("rc", True, False, ExitCode.FAILED),
        ("2.14.1", False, False, ExitCode.FAILED),  # a pinned release always blocks
    ],
)
def test_a_failed_run_of_a_prerelease_exits_0_unless_it_blocks(version, blocks, flag, code, capsys):
    settings = with_flag(replace(ReportSettings(), prerelease_blocks=blocks), flag)
    assert run_exit(version, ExitCode.FAILED, settings) == code
    said = capsys.readouterr().err
    assert ("its failures do not block" in said) == (code == ExitCode.PASSED)


@pytest.mark.parametrize(("flag", "code"), [(False, ExitCode.PASSED), (True, ExitCode.FAILED)])
def test_report_check_upgrade_blocks_on_a_nightly_only_with_the_flag(tmp_path, flag, code, capsys):
    """The fixture run's candidate outcomes (regressions, grown drift) under the label `nightly`."""
    matrix = write_project(tmp_path)
    run_dir = tmp_path / "reports" / "run-nightly"
    write_version(run_dir, BASELINE, matrix)
    write_version(run_dir, "nightly", matrix, outcome_for=lambda _, suite, cell: outcomes(CANDIDATE, suite, cell))
    assert report_run(run_dir, check_upgrade=True, prerelease_blocks=flag) == code
    said = capsys.readouterr()
    assert ("upgrade diff 2.13.0 → nightly is not clean" in said.err) == flag
    assert "### Pre-release check `2.13.0` → `nightly`" in (run_dir / "summary.md").read_text()


FAILED_CELL = (
    '<testsuites><testsuite name="resume" tests="1" failures="1" errors="0" skipped="0">'
    '<testcase classname="resume" name="test_resume_is_exact"><failure message="loss differs"/></testcase>'
    "</testsuite></testsuites>"
)
PASSED_CELL = (
    '<testsuites><testsuite name="resume" tests="1" failures="0" errors="0" skipped="0">'
    '<testcase classname="resume" name="test_resume_is_exact"/></testsuite></testsuites>'
)


def test_a_merged_run_whose_only_failures_are_a_nightlys_exits_0_unless_it_blocks(tmp_path, capsys):
    (tmp_path / "torch-2.13.0").mkdir()
    (tmp_path / "torch-2.13.0" / "ws1.xml").write_text(PASSED_CELL)
    (tmp_path / "torch-nightly" / "reads").mkdir(parents=True)
    (tmp_path / "torch-nightly" / "reads" / "ws1.xml").write_text(FAILED_CELL)
    assert failed_versions(tmp_path) == ["nightly"]
    assert merged_exit(failed_versions(tmp_path), ReportSettings()) == ExitCode.PASSED
    assert "torch nightly is a pre-release build: its failures do not block" in capsys.readouterr().err
    assert merged_exit(["nightly"], with_flag(ReportSettings(), True)) == ExitCode.FAILED
    assert merged_exit(["nightly", "2.13.0"], ReportSettings()) == ExitCode.FAILED
    assert merged_exit([], ReportSettings()) == ExitCode.PASSED
