"""A crafted run directory for the report tests: two torch versions, every status, shared runs, drift.

It is written with the runner's own JUnit writer, then host and timestamps are pinned, so the
golden files stay byte-stable. Cells ws1-none, ws1-fsdp2, ws2-none, ws2-fsdp2; suite `alpha`
runs in every cell, suite `beta` once per world size (ws1-none and ws2-none stand for the rest).

What changes from 2.13.0 (baseline) to 2.14.1 (every failure was re-run alone):
  alpha test_regress   passed -> failed in ws2-fsdp2, fails alone         (regression)
  alpha test_fixed     failed (fails alone) -> passed in ws1-none         (fix)
  alpha test_flaky     passed -> failed in ws1-fsdp2, passed alone        (unconfirmed: order-dependent)
  alpha test_drift     grad_max_abs/layer0.w 1e-9 -> 1e-6 in ws2-fsdp2    (drift grown 1000x)
  alpha test_divide    passed -> CPU-simulation limit (PREMUL_SUM on gloo)
                       in ws2-none                                        (newly skipped, not a regression)
  beta  test_slow[i]   1 s -> 3 s per run, three of them                  (suite slower)
  beta  test_skipped   passed -> skipped                                  (newly skipped)
  beta  test_broken    error in ws2 on both, fails alone                  (still failing, not a change)
"""

from __future__ import annotations

import json
import os
import textwrap
from dataclasses import replace
from pathlib import Path

from torchmatrix.env.devices import Environment
from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.config import Suite
from torchmatrix.matrix.plan import SuiteRun, plan_runs
from torchmatrix.messages.events import TestOutcome
from torchmatrix.ranks.simulation_limits import LIMITS, limit_message
from torchmatrix.reports import junit
from torchmatrix.reports.report import write_report
from torchmatrix.status import Confirmation

from helpers.matrix_files import write_matrix

BASELINE, CANDIDATE = "2.13.0", "2.14.1"
HOST = "fixture-host"
TIMESTAMP = "2026-01-02T03:04:05+00:00"
RUN_ID = "run-fixture"
GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
ALONE = Confirmation.FAILS_ALONE
HOSTILE = (
    "x<script>alert(\"pwned\")</script>&amp; 'q' `tick` | pipe **bold** [link](http://e.invalid) \x9b31m\u202e\x07 end"
)
ENVIRONMENTS = {
    BASELINE: Environment(torch="2.13.0+cpu", git_version="aaa111"),
    CANDIDATE: Environment(torch="2.14.1+cpu", git_version="bbb222"),
}
CELLS = [Cell({"world_size": ws, "fsdp": fsdp}) for ws in (1, 2) for fsdp in ("none", "fsdp2")]
SUITES = {
    "alpha": Suite("alpha", "suites/test_alpha.py", 60.0, ("world_size", "fsdp")),
    "beta": Suite("beta", "suites/test_beta.py", 60.0, ("world_size",)),
}
MATRIX = {
    "torch": [BASELINE, CANDIDATE],
    "baseline": BASELINE,
    "axes": {"world_size": [1, 2], "fsdp": ["none", "fsdp2"]},
    "suites": {"alpha": {"timeout": 60}, "beta": {"timeout": 60, "axes": ["world_size"]}},
    "report": {"drift_ratio": 10.0, "slowdown_ratio": 1.5},
}
TRACEBACK = textwrap.dedent(
    """\
    Traceback (most recent call last):
      File "suites/test_alpha.py", line 12, in test_regress
        assert grads_equal
    AssertionError: gradient of layer0.w differs
    """
)

PREMUL_SUM_TRACEBACK = textwrap.dedent(
    """\
    Traceback (most recent call last):
      File "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", line 600, in foreach_reduce
        dist.reduce_scatter_tensor(output=reduce_output, input=reduce_scatter_input, op=reduce_scatter_op)
    RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo
    """
)
PREMUL_SUM_LIMIT = limit_message("RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo", LIMITS[0])


def outcomes(version: str, suite: str, cell: Cell) -> list[TestOutcome]:
    """The tests a suite run in `cell` reports under `version` (cell is the run's own cell)."""
    new = version == CANDIDATE
    if suite == "alpha":
        regressed = new and cell.id == "ws2-fsdp2"
        still_broken = not new and cell.id == "ws1-none"
        drift = 1e-6 if new and cell.id == "ws2-fsdp2" else 1e-9
        flaky = new and cell.id == "ws1-fsdp2"
        return [
            TestOutcome("alpha", "test_ok", "passed", 0.25),
            TestOutcome(
                "alpha",
                "test_regress",
                "failed",
                0.5,
                "AssertionError: gradient of layer0.w differs",
                TRACEBACK,
                confirmation=ALONE,
                confirmation_note="failed: AssertionError: gradient of layer0.w differs",
            )
            if regressed
            else TestOutcome("alpha", "test_regress", "passed", 0.5),
            TestOutcome(
                "alpha",
                "test_fixed",
                "failed",
                0.5,
                "AssertionError: assert 3 == 4",
                "E   assert 3 == 4",
                confirmation=ALONE,
            )
            if still_broken
            else TestOutcome("alpha", "test_fixed", "passed", 0.5),
            TestOutcome(
                "alpha",
                "test_flaky",
                "failed",
                0.5,
                "RuntimeError: Connection closed by peer [127.0.0.1]:41234",
                confirmation=Confirmation.PASSED_ALONE,
                confirmation_note="passed",
            )
            if flaky
            else TestOutcome("alpha", "test_flaky", "passed", 0.5),
            TestOutcome("alpha", "test_divide", "CPU-simulation limit", 0.5, PREMUL_SUM_LIMIT, PREMUL_SUM_TRACEBACK)
            if new and cell.id == "ws2-none"
            else TestOutcome("alpha", "test_divide", "passed", 0.5),
            TestOutcome(
                "alpha",
                "test_drift[0.0]",
                "passed",
                0.75,
                properties=[
                    ["grad_max_abs/layer0.w", drift],
                    ["grad_max_rel/layer0.w", 1e-7],
                    ["loss_max_abs", 0.0],
                    ["sharded_states", 3],
                ],
            ),
        ]
    broken = cell.world_size == 2
    return [
        *(TestOutcome("beta", f"test_slow[{i}]", "passed", 3.0 if new else 1.0) for i in range(3)),
        TestOutcome("beta", "test_skipped", "skipped", 0.0, "needs TransformerEngine")
        if new
        else TestOutcome("beta", "test_skipped", "passed", 0.5),
        TestOutcome(
            "beta",
            "test_broken",
            "error",
            60.0,
            "rank 1 died with signal SIGKILL",
            "rank 1: killed by signal 9",
            confirmation=ALONE,
        )
        if broken
        else TestOutcome("beta", "test_broken", "passed", 0.5),
    ]


def write_project(root: Path) -> Path:
    """matrix.toml and (empty) suite files, so the report finds baseline and thresholds in plan.json."""
    (root / "suites").mkdir(parents=True, exist_ok=True)
    for suite in SUITES.values():
        (root / suite.path).write_text("")
    return write_matrix(root, **MATRIX)


def write_version(run_dir: Path, version: str, matrix: Path, outcome_for=outcomes) -> None:
    """One torch version's per-cell JUnit files and plan.json, as `torchmatrix run` writes them."""
    version_dir = run_dir / f"torch-{version}"
    environment = ENVIRONMENTS.get(version) or replace(ENVIRONMENTS[CANDIDATE], torch=f"{version}+cpu")
    runs = plan_runs(CELLS, SUITES)
    for cell in CELLS:
        pairs = [(run, o) for run in runs if cell in run.covers for o in outcome_for(version, run.suite.name, run.cell)]
        suite = junit.cell_report(version, environment, cell, pairs)
        suite.hostname, suite.timestamp = HOST, TIMESTAMP
        junit.write_suites(version_dir / f"{cell.id}.xml", [suite])
    plan = {
        "torch": version,
        "matrix": str(matrix),
        "matrix_sha256": "0123456789abcdef" * 4,
        "baseline": MATRIX["baseline"],
        "thresholds": MATRIX["report"],
        "only": {},
        "keyword": None,
        "shard": None,
        "environment": environment.to_json(),
        "cells": [cell.id for cell in CELLS],
        "pool_starts": 2,
    }
    (version_dir / "plan.json").write_text(json.dumps(plan, indent=2))


def write_fixture_run(root: Path, versions=(BASELINE, CANDIDATE), run_id: str = RUN_ID) -> Path:
    """The project with matrix.toml and a run directory reports/<run_id> of the given versions."""
    matrix = write_project(root)
    run_dir = root / "reports" / run_id
    for version in versions:
        write_version(run_dir, version, matrix)
    return run_dir


def write_hostile_run(root, text: str = HOSTILE):
    """One cell whose axis value, suite, test, message, failure text and figure name are all `text`."""
    matrix = write_project(root)
    run_dir = root / "reports" / "hostile"
    cell = Cell({"world_size": 1, "fsdp": text})
    run = SuiteRun(Suite(text, "suites/test_alpha.py", 60.0, ("fsdp",)), cell, (cell,))
    outcome = TestOutcome(
        text, f"test_{text}", "failed", 1.0, text, text + "\n" + text, [[f"grad_max_abs/{text}", 0.5]]
    )
    suite = junit.cell_report(BASELINE, ENVIRONMENTS[BASELINE], cell, [(run, outcome)])
    junit.write_suites(run_dir / f"torch-{BASELINE}" / "hostile.xml", [suite])
    (run_dir / f"torch-{BASELINE}" / "plan.json").write_text(
        # plan.json names only planned cells, whose ids are plain by construction; the hostile one is in the XML
        json.dumps({"torch": BASELINE, "matrix": str(matrix), "cells": []})
    )
    write_report(run_dir)
    return run_dir


def normalised(text: str, project) -> str:
    """Output with the temporary project path replaced, so golden files do not depend on tmp_path."""
    return text.replace(str(project), "<project>")


def check_golden(run_dir: Path, name: str) -> None:
    """Compare the file `name` of the fixture's `run_dir`, its project path masked, with
    tests/data/golden/<name>; TORCHMATRIX_UPDATE_GOLDEN=1 rewrites it instead."""
    actual = normalised((run_dir / name).read_text(), run_dir.parents[1])
    path = GOLDEN / name
    if os.environ.get("TORCHMATRIX_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
    assert actual == path.read_text(), (
        f"{name} differs from its golden file; rerun with TORCHMATRIX_UPDATE_GOLDEN=1 and review the diff"
    )


def write_single_version_run(root: Path, version: str, run_id: str, outcome_for=outcomes) -> Path:
    """A run directory of one torch version, `version`, with the fixture's outcomes for it."""
    matrix = write_project(root)
    run_dir = root / "reports" / run_id
    write_version(run_dir, version, matrix, outcome_for)
    return run_dir
