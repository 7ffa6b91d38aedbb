"""End to end: a test `[[known_failure]]` covers reports "expected failure" with its reason, not red;
one that passes says so (a property and a message), and the run exits 0."""

from __future__ import annotations

import pytest

from helpers.matrix_files import matrix_toml
from helpers.run_results import cell_outcomes

pytestmark = pytest.mark.slow

SUITE = """
def test_hits_the_bug(cell):
    assert cell["compile"] != "inductor", "the upstream bug"


def test_fixed_upstream(cell):
    pass


def test_unrelated(cell):
    pass
"""

ENTRY = """
[[known_failure]]
test = ["demo::test_hits_the_bug", "demo::test_fixed_upstream"]
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
    assert cell_outcomes(version_dir) == {
        "none": {"test_hits_the_bug": "passed", "test_fixed_upstream": "passed", "test_unrelated": "passed"},
        "inductor": {"test_hits_the_bug": "skipped", "test_fixed_upstream": "passed", "test_unrelated": "passed"},
    }
    xml = (version_dir / "inductor.xml").read_text()
    assert 'message="expected failure: pytorch#1: compiled blocks at a second length"' in xml
    assert (
        'name="demo::test_fixed_upstream::known_failure_passed" value="pytorch#1: compiled blocks at a second length"'
        in xml
    )
    assert xml.count("known_failure_passed") == 1, "only the covered test that passed carries it"
    assert "known_failure_passed" not in (version_dir / "none.xml").read_text(), "the entry covers inductor cells only"
