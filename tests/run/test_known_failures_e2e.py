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
