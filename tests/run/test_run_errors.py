"""User-caused problems around a run: each is one clear line or an errored cell, never a gap."""

from __future__ import annotations

import pytest
from junitparser import JUnitXml

MATRIX = """
[torch]
versions = ["2.13.0", "9.9.9"]

[axes]
world_size = [1, 2]

[suites.demo]
path = "suites/test_demo.py"
timeout = 30
"""


@pytest.fixture
def demo(project):
    project.write("matrix.toml", MATRIX)
    project.write("suites/test_demo.py", "def test_x(cell):\n    pass\n")
    return project


def merged_cases(project):
    return [
        (suite.name, case)
        for suite in JUnitXml.fromfile(str(project.root / "reports" / "latest" / "junit.xml"))
        for case in suite
    ]


def test_a_torch_that_failed_to_install_errors_every_cell_with_pips_output(demo):
    log = demo.write("install.log", "ERROR: Could not find a version that satisfies the requirement torch==9.9.9\n")
    done = demo.torchmatrix("run", "--torch", "9.9.9", "--install-log", str(log))
    assert done.returncode == 1
    cases = merged_cases(demo)
    assert [name for name, _ in cases] == ["torch-9.9.9/ws1", "torch-9.9.9/ws2"]
    for _, case in cases:
        assert case.is_error
        assert "torch==9.9.9 failed to install" in case.result[0].message
        assert "Could not find a version" in case.result[0].text


def test_a_venv_with_another_torch_is_reported_not_run(demo):
    done = demo.torchmatrix("run", "--torch", "9.9.9")
    assert done.returncode == 1
    for _, case in merged_cases(demo):
        assert case.is_error and "not 9.9.9" in case.result[0].message


def test_a_version_missing_from_the_matrix_is_a_usage_error(demo):
    done = demo.torchmatrix("run", "--torch", "2.99.0")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "not in [torch].versions" in done.stderr


def test_a_paired_run_may_name_a_release_outside_the_matrix_but_its_venv_must_have_it(demo):
    """bisect's steps pass --peer with a release between the pins; the environment is still checked."""
    done = demo.torchmatrix("run", "--torch", "2.99.0", "--peer", "2.13.0")
    assert done.returncode == 1, done.stderr
    for _, case in merged_cases(demo):
        assert case.is_error and "not 2.99.0" in case.result[0].message


def test_an_unwritable_reports_path_fails_before_any_cell(demo):
    demo.write("taken", "a file where the reports directory should go")
    done = demo.torchmatrix("run", "--torch", "system", "--reports", "taken/reports")
    assert done.returncode == 2
    assert "cannot write reports to" in done.stderr and "--reports" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unwritable_compile_cache_fails_before_any_cell_naming_both_ways_out(demo):
    demo.write("taken", "a file where the compile cache should go")
    done = demo.torchmatrix("run", "--torch", "system", "--compile-cache", "taken/store")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    assert "cannot write the compile cache to" in done.stderr
    assert "--compile-cache DIR" in done.stderr and "--cold-compile" in done.stderr


def test_bad_filters_are_usage_errors(demo):
    for args in (["--only", "flavor=x"], ["--shard", "3/2"], ["-k", "ws1 and"]):
        done = demo.torchmatrix("list", *args)
        assert done.returncode == 2, args
        assert done.stderr.startswith("torchmatrix: error:") and done.stderr.count("\n") == 1, done.stderr


def test_an_empty_shard_is_an_empty_run_that_still_reports(demo):
    """More shards than cells leave one empty (a -k or --only that selects nothing is a typo, refused
    in tests/hostile); that shard's job still reports."""
    done = demo.torchmatrix("run", "--torch", "system", "--shard", "3/3", "--run-id", "empty")
    assert done.returncode == 0, done.stderr
    assert "0 cells" in done.stdout
    report = demo.torchmatrix("report", "reports/empty")
    assert report.returncode == 0, report.stderr
    assert (demo.root / "reports" / "empty" / "summary.md").is_file()


SELECTED_SUITE = """
import pytest


@pytest.mark.parametrize("n", [1, 2])
def test_p(cell, n):
    pass


def test_other(cell):
    pass
"""


@pytest.mark.slow
def test_a_test_name_runs_every_parametrization_and_one_that_matches_nothing_errors_naming_them(project):
    project.write("matrix.toml", MATRIX.replace("world_size = [1, 2]", "world_size = [1]"))
    project.write("suites/test_demo.py", SELECTED_SUITE)
    done = project.torchmatrix(
        "run", "--torch", "system", "--confirm-limit", "0", "--test", "demo::test_p", "--test", "demo::test_p[n=3]"
    )
    assert done.returncode == 1, done.stderr
    cases = {case.name.split("[torch=", 1)[0]: case for _, case in merged_cases(project)}
    assert sorted(cases) == ["test_p[n=1]", "test_p[n=2]", "test_p[n=3]"], "test_other is not run"
    assert not cases["test_p[n=1]"].result and not cases["test_p[n=2]"].result
    assert cases["test_p[n=3]"].is_error
    assert cases["test_p[n=3]"].result[0].message == (
        "--test demo::test_p[n=3] matches no test of suite demo in this cell; "
        "test_p runs here as test_p[n=1], test_p[n=2]; name one of them, or test_p for all"
    )
    missing = project.torchmatrix("run", "--torch", "system", "--test", "demo::test_q")
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        "torchmatrix: error: --test demo::test_q matches no test of suite demo (test_demo.py); its tests: test_other, test_p"
    )
