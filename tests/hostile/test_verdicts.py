"""Hostile and unlucky inputs whose exit code is the verdict CI reads: each case is data (the
files it writes, the command, the exit code, and what the output must say). Exit 1 means the
checked thing regressed, 2 that the input cannot give a verdict (one line, no traceback).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from torchmatrix.reports.upgrade_diff import BROKEN_DIRECTION, GROWN_DRIFT, MEMORY, REGRESSION, SLOWDOWN, UNCONFIRMED

from helpers.projects import Project
from helpers.results_documents import results_document

VERSION = {"torch": "2.13.0", "planned_cells": ["ws1"], "missing_cells": []}


def _record(cell: str = "ws1", status: str = "passed", **extra) -> dict:
    return {"torch": "2.13.0", "cell": cell, "suite": "s", "test": "t", "status": status, "duration": 1.0, **extra}


def _run(run_id: str, *tests: dict, versions: tuple[str, ...] = ("2.13.0",)) -> str:
    """A results.json of these torch versions (one by default) holding `tests`."""
    return json.dumps(
        results_document(
            schema_version=3,
            run_id=run_id,
            versions=[{**VERSION, "torch": version} for version in versions],
            tests=tests,
        )
    )


@dataclass
class Verdict:
    """One input, the command, its exit code and a line the output (stdout, or the one stderr line) must hold."""

    id: str
    what: str
    args: list[str]
    exit_code: int
    says: str
    files: dict[str, str] = field(default_factory=dict)


def _cross(torch: str, test: str, status: str = "passed", **extra) -> dict:
    return {**_record(status=status, **extra), "torch": torch, "suite": "cross_version", "test": test}


def _rollback(run_id: str, read_status: str) -> str:
    """Both versions wrote and read each other's checkpoint; the baseline's read of 2.15.0's ended `read_status`."""
    writes = [_cross(v, "test_writes_checkpoint_for_other_versions") for v in ("2.13.0", "2.15.0")]
    reads = [
        _cross("2.13.0", "test_loads_checkpoint_written_by[writer=2.15.0]", read_status, message="too many values"),
        _cross("2.15.0", "test_loads_checkpoint_written_by[writer=2.13.0]"),
    ]
    return _run(run_id, *writes, *reads, versions=("2.13.0", "2.15.0"))


CASES = [
    Verdict(
        "compare-confirmed-regression",
        "passed -> failed, and the failure fails alone: a regression",
        ["compare", "a.json", "b.json"],
        1,
        f"**compare exits 1 on**: {REGRESSION.meaning}.",
        files={
            "a.json": _run("a", _record()),
            "b.json": _run("b", _record(status="failed", message="AssertionError: boom", confirmation="fails alone")),
        },
    ),
    Verdict(
        "compare-suite-slower",
        "four tests of one suite took 3x as long (wall time: no CPU time recorded)",
        ["compare", "a.json", "b.json"],
        1,
        f"**compare exits 1 on**: {SLOWDOWN.meaning}.",
        files={
            "a.json": _run("a", *(_record(duration=2.0) | {"test": f"t{i}"} for i in range(4))),
            "b.json": _run("b", *(_record(duration=6.0) | {"test": f"t{i}"} for i in range(4))),
        },
    ),
    Verdict(
        "compare-broken-rollback",
        "run B's baseline cannot read its candidate's checkpoint; every test that both runs ran passed",
        ["compare", "a.json", "b.json"],
        1,
        f"**compare exits 1 on**: {BROKEN_DIRECTION.meaning}.",
        files={"a.json": _rollback("a", "passed"), "b.json": _rollback("b", "failed")},
    ),
    Verdict(
        "compare-drift-grew",
        "a drift figure grew 10^7 times (README: exit 1 on drift)",
        ["compare", "a.json", "b.json"],
        1,
        f"**compare exits 1 on**: {GROWN_DRIFT.meaning}.",
        files={
            "a.json": _run("a", _record(figures={"grad_max_abs/w": 1e-9})),
            "b.json": _run("b", _record(figures={"grad_max_abs/w": 1e-2})),
        },
    ),
    Verdict(
        "compare-memory-grew",
        "a checkpointed step's activations tripled (a selective-checkpoint policy that saves every op)",
        ["compare", "a.json", "b.json"],
        1,
        f"**compare exits 1 on**: {MEMORY.meaning}.",
        files={
            "a.json": _run("a", _record(figures={"step_peak_bytes/activations": 64648, "step_peak_bytes": 901884})),
            "b.json": _run("b", _record(figures={"step_peak_bytes/activations": 228232, "step_peak_bytes": 901884})),
        },
    ),
    Verdict(
        "compare-failure-never-rerun",
        "passed -> failed, never re-run alone (--confirm-limit 0): it cannot tell, so it is not clean",
        ["compare", "a.json", "b.json"],
        1,
        f"**compare exits 1 on**: {UNCONFIRMED.meaning}.",
        files={
            "a.json": _run("a", _record()),
            "b.json": _run("b", _record(status="failed", message="AssertionError: boom")),
        },
    ),
    Verdict(
        "compare-failure-passed-alone",
        "passed -> failed, but the failure passed alone (order-dependent): listed, not a failure of compare",
        ["compare", "a.json", "b.json"],
        0,
        "Unconfirmed changes",
        files={
            "a.json": _run("a", _record()),
            "b.json": _run("b", _record(status="failed", confirmation="passed alone")),
        },
    ),
    Verdict(
        "compare-400-digit-figure",
        "a drift figure written as a 400-digit integer reads as infinite, not as an OverflowError",
        ["compare", "a.json", "a.json"],
        0,
        "(1 tests compared)",
        files={"a.json": _run("a", _record(figures={"grad_max_abs/w": 10**399}))},
    ),
    Verdict(
        "compare-400-digit-duration",
        "a duration written as a 400-digit integer",
        ["compare", "a.json", "a.json"],
        2,
        "torchmatrix: error: a.json: malformed (tests[].duration is not a finite number of seconds)",
        files={"a.json": _run("a", _record(duration=10**399))},
    ),
    Verdict(
        "compare-deep-array",
        "a results.json nested 10^5 arrays deep (RecursionError in the JSON decoder)",
        ["compare", "a.json", "a.json"],
        2,
        "torchmatrix: error: cannot read a.json: nested too deeply for a results file",
        files={"a.json": "[" * 100_000},
    ),
    Verdict(
        "compare-no-shared-test",
        "two runs that share no cell: 0 tests compared is no verdict",
        ["compare", "a.json", "b.json"],
        2,
        "torchmatrix: error: run a and run b share no test (1 and 1 results, none of the same suite, test and cell)",
        files={"a.json": _run("a", _record(cell="ws1")), "b.json": _run("b", _record(cell="ws2"))},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_the_exit_code_is_the_verdict(tmp_path, case):
    project = Project(tmp_path / "project")
    for relative, content in case.files.items():
        project.write(relative, content)
    done = project.torchmatrix(*case.args, timeout=120)
    assert done.returncode == case.exit_code, (case.what, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, case.what
    if case.exit_code == 2:
        assert done.stderr.strip().splitlines() == [done.stderr.strip()], (case.what, done.stderr)
        assert done.stderr.startswith(case.says), (case.what, done.stderr)
    else:
        assert case.says in done.stdout, (case.what, done.stdout)


def test_a_refused_merge_leaves_out_as_it_was_and_the_corrected_one_passes(tmp_path):
    """The same cell reported twice is refused before anything is written into --out."""
    project = Project(tmp_path / "project")
    project.write(
        "matrix.toml",
        '[torch]\nversions = ["system"]\n[axes]\nworld_size = [1]\n[suites.s]\npath = "suites/test_s.py"\n',
    )
    project.write("suites/test_s.py", "def test_t(cell):\n    pass\n")
    done = project.torchmatrix("run", "--torch", "system", "--run-id", "a", "--reports", "shard")
    assert done.returncode == 0, done.stderr
    twice = project.torchmatrix(
        "merge", "shard/a", "shard/a/torch-system/..", "--out", "merged", "--versions", "system"
    )
    assert twice.returncode == 2 and "is reported twice" in twice.stderr, twice.stderr
    assert not (project.root / "merged").exists() or not any((project.root / "merged").iterdir())
    once = project.torchmatrix("merge", "shard/a", "--out", "merged", "--versions", "system")
    assert once.returncode == 0, once.stderr
    assert (project.root / "merged" / "torch-system" / "ws1.xml").is_file()


def test_a_matrix_file_with_a_byte_order_mark_is_read(tmp_path):
    project = Project(tmp_path / "project")
    text = '[torch]\nversions = ["system"]\n[axes]\nworld_size = [1, 2]\n[suites.s]\npath = "suites/test_s.py"\n'
    (project.root / "matrix.toml").write_bytes(b"\xef\xbb\xbf" + text.encode())
    project.write("suites/test_s.py", "def test_t(cell):\n    pass\n")
    done = project.torchmatrix("list")
    assert (done.returncode, done.stdout.split()) == (0, ["ws1", "ws2"]), done.stderr


def test_a_project_path_with_a_space_is_quoted_in_sbatch_chdir(tmp_path):
    project = Project(tmp_path / "my project")
    project.write(
        "matrix.toml",
        '[torch]\nversions = ["2.13.0"]\n[axes]\nworld_size = [1]\n[suites.s]\npath = "suites/test_s.py"\n',
    )
    project.write("suites/test_s.py", "def test_t(cell):\n    pass\n")
    done = project.torchmatrix("slurm", "--gpus-per-node", "2")
    assert done.returncode == 0, done.stderr
    cells = (project.root / "reports" / "slurm" / "cells.sbatch").read_text()
    assert f'#SBATCH --chdir="{project.root}"\n' in cells
