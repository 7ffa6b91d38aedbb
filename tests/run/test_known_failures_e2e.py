"""End to end: a test `[[known_failure]]` covers reports "expected failure" with its reason, not red;
one that passes says so (a property and a message), and the run exits 0."""

from __future__ import annotations

import pytest

from helpers.matrix_files import matrix_toml
from helpers.run_results import cell_outcomes

pytestmark = pytest.mark.slow

SUITE = """
import pytest


def test_hits_the_bug(cell):
    assert cell["compile"] != "inductor", "the upstream bug"


def test_fixed_upstream(cell):
    pass


def test_unrelated(cell):
    pass


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_one_case_hits_it(cell, dropout):
    assert not (cell["compile"] == "inductor" and dropout), "the upstream bug, with dropout only"
"""

ENTRY = """
[[known_failure]]
test = ["demo::test_hits_the_bug", "demo::test_fixed_upstream", "demo::test_one_case_hits_it[dropout=0.1]"]
compile = "inductor"
reason = "pytorch#1: compiled blocks at a second length"
"""


def test_known_failures_are_expected_and_a_fixed_one_says_so(project):
    project.write("suites/test_demo.py", SUITE)
    project.write(
        "matrix.toml",
        matrix_toml(axes={"compile": ["none", "inductor"]}, suites={"demo": {"timeout": 60}}) + ENTRY,
    )
    done = project.torchmatrix("run", "--torch", "system", "--run-id", "known")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    version_dir = project.root / "reports" / "known" / "torch-system"
    passed = {"test_one_case_hits_it[dropout=0.0]": "passed", "test_one_case_hits_it[dropout=0.1]": "passed"}
    assert cell_outcomes(version_dir) == {
        "none": {"test_hits_the_bug": "passed", "test_fixed_upstream": "passed", "test_unrelated": "passed"} | passed,
        "inductor": {"test_hits_the_bug": "skipped", "test_fixed_upstream": "passed", "test_unrelated": "passed"}
        | passed
        | {"test_one_case_hits_it[dropout=0.1]": "skipped"},
    }, "a name written with its parameters covers that case alone"
    xml = (version_dir / "inductor.xml").read_text()
    assert 'message="expected failure: pytorch#1: compiled blocks at a second length"' in xml
    assert (
        'name="demo::test_fixed_upstream::known_failure_passed" value="pytorch#1: compiled blocks at a second length"'
        in xml
    )
    assert xml.count("known_failure_passed") == 1, "only the covered test that passed carries it"
    assert "known_failure_passed" not in (version_dir / "none.xml").read_text(), "the entry covers inductor cells only"


RECALLED_SUITE = """
import os
from pathlib import Path

import pytest

RUNS = Path(__file__).resolve().parent.parent / "runs.log"


def _leave():
    os._exit(3)


def test_hits_the_bug(cell):
    with RUNS.open("a") as log:
        log.write(f"hits {cell['compile']}\\n")
    assert cell["compile"] != "inductor", "the upstream bug"


@pytest.fixture
def shared_run(cell):
    with RUNS.open("a") as log:
        log.write(f"fixture {cell['compile']}\\n")
    assert cell["compile"] != "inductor", "the upstream bug, in a fixture the cell's tests share"


def test_reads_a_failing_fixture(cell, shared_run):
    pass


def test_kills_a_rank(cell, ranks, once_per_cell):
    with RUNS.open("a") as log:
        log.write(f"kills {cell['compile']}\\n")
    if cell["compile"] == "inductor":
        once_per_cell("the run a rank dies in", lambda: ranks.run(_leave))


def test_reads_the_run_a_rank_died_in(cell, ranks, once_per_cell):
    with RUNS.open("a") as log:
        log.write(f"reads {cell['compile']}\\n")
    if cell["compile"] == "inductor":
        once_per_cell("the run a rank dies in", lambda: ranks.run(_leave))
"""

RECALLED_ENTRY = """
[[known_failure]]
test = ["demo::test_hits_the_bug", "demo::test_reads_a_failing_fixture", "demo::test_kills_a_rank", "demo::test_reads_the_run_*"]
compile = "inductor"
reason = "pytorch#2: the first forward of the modern stack"
"""


def test_a_known_failure_that_failed_under_the_same_compile_key_is_recalled_not_run_again(project):
    """The second run reports the known failures the store saw fail (in the test, or in a fixture it
    shares) without running them, with the root cause each failed with; a rank that died is no failure
    to recall; changed sources run them."""
    project.write("suites/test_demo.py", RECALLED_SUITE)
    project.write(
        "matrix.toml",
        matrix_toml(axes={"compile": ["none", "inductor"]}, suites={"demo": {"timeout": 60}}) + RECALLED_ENTRY,
    )
    runs = project.root / "runs.log"

    def run(run_id: str) -> str:
        done = project.torchmatrix("run", "--torch", "system", "--run-id", run_id)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        version_dir = project.root / "reports" / run_id / "torch-system"
        assert cell_outcomes(version_dir)["inductor"] == {
            "test_hits_the_bug": "skipped",
            "test_reads_a_failing_fixture": "skipped",
            "test_kills_a_rank": "skipped",
            "test_reads_the_run_a_rank_died_in": "skipped",
        }
        return (version_dir / "inductor.xml").read_text()

    first = run("first")
    assert sorted(runs.read_text().split("\n")[:-1]) == [
        "fixture inductor",
        "fixture none",
        "hits inductor",
        "hits none",
        "kills inductor",
        "kills none",
        "reads inductor",
        "reads none",
    ]
    assert "not run again" not in first and "known_failure_recalled" not in first

    runs.write_text("")
    second = run("second")
    assert sorted(runs.read_text().split("\n")[:-1]) == [
        "fixture none",
        "hits none",
        "kills inductor",
        "kills none",
        "reads inductor",
        "reads none",
    ], "the known failures that raised are recalled, not run; those whose (shared) run lost a rank run again"
    assert (
        'message="expected failure: pytorch#2: the first forward of the modern stack (not run again: it failed in an'
        in second
    )
    assert "AssertionError: the upstream bug" in second, "the recalled root cause is in the report"
    assert "the upstream bug, in a fixture" in second, "a fixture's failure is recalled with its own root cause"
    assert second.count("not run again") == 2, "a test whose rank died, or that read a run one died in, is run"

    runs.write_text("")
    project.write("suites/test_demo.py", RECALLED_SUITE + "\n# another source: another compile key\n")
    third = run("third")
    assert {"hits inductor", "fixture inductor"} <= set(runs.read_text().split("\n")), (
        "under a changed source the known failures run again"
    )
    assert "not run again" not in third
