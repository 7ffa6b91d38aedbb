"""A broken checkpoint direction in the written reports: a finding of the pair, attributed to the
candidate, in its own grid column, totals row and junit testsuite, and first in both summaries
with its root cause whole and the run's own paths relative. The run directory is written with the
runner's own JUnit writer: a rollback 2.14.1 → 2.13.0 that fails in every cell, a forward that loads."""

from __future__ import annotations

import json

from junitparser import JUnitXml
from lxml import etree

from torchmatrix.matrix.config import Suite
from torchmatrix.matrix.plan import SuiteRun
from torchmatrix.messages.events import TestOutcome as Outcome
from torchmatrix.reports import junit
from torchmatrix.reports.closing import closing_lines
from torchmatrix.reports.report import load_run, write_report
from torchmatrix.reports.upgrade_diff import upgrade_diffs

from helpers.checkout import REPO
from helpers.report_runs import BASELINE, CANDIDATE, CELLS, ENVIRONMENTS, write_project

SCHEMA = etree.XMLSchema(etree.parse(str(REPO / "tests" / "data" / "junit-10.xsd")))
SUITE = Suite("cross_version", "suites/test_cross_version.py", 60.0, ("world_size", "fsdp"))
WRITE, READ = "test_writes_checkpoint_for_other_versions", "test_loads_checkpoint_written_by[writer={}]"
# DCP's message is long and names the checkpoint by its absolute path: both must survive whole, the path relative.
DETAIL = "x" * 400
UNPACK = "CheckpointException: global metadata read failed at {path}: too many values to unpack (expected 5) " + DETAIL


def write_cell(path, version: str, cell, outcomes: list[Outcome]) -> None:
    run = SuiteRun(SUITE, cell, (cell,))
    junit.write_suites(path, [junit.cell_report(version, ENVIRONMENTS[version], cell, [(run, o) for o in outcomes])])


def write_broken_rollback(root):
    """Both versions write in every cell; 2.13.0 cannot read 2.14.1's checkpoints, 2.14.1 reads 2.13.0's."""
    matrix = write_project(root)
    run_dir = root / "reports" / "run-rollback"
    for version, peer in ((BASELINE, CANDIDATE), (CANDIDATE, BASELINE)):
        version_dir = run_dir / f"torch-{version}"
        for cell in CELLS:
            write_cell(version_dir / f"{cell.id}.xml", version, cell, [Outcome(SUITE.name, WRITE, "passed", 1.0)])
            checkpoint = run_dir / f"torch-{peer}" / "checkpoints" / cell.id / ".metadata"
            read = (
                Outcome(SUITE.name, READ.format(peer), "failed", 1.0, UNPACK.format(path=checkpoint))
                if version == BASELINE
                else Outcome(SUITE.name, READ.format(peer), "passed", 1.0)
            )
            write_cell(version_dir / "reads" / f"{cell.id}.xml", version, cell, [read])
        plan = {"torch": version, "matrix": str(matrix), "environment": ENVIRONMENTS[version].to_json()}
        plan["cells"] = [cell.id for cell in CELLS]
        (version_dir / "plan.json").write_text(json.dumps(plan))
    write_report(run_dir)
    return run_dir


def test_a_broken_rollback_is_a_regression_of_the_candidate_and_opens_both_summaries(tmp_path):
    run_dir = write_broken_rollback(tmp_path / "project")
    markdown = (run_dir / "summary.md").read_text()
    verdict = markdown.index(f"### Verdict `{BASELINE}` → `{CANDIDATE}`")
    assert verdict < markdown.index("| torch | build") < markdown.index("### Grid")
    lines = markdown[verdict:].split("\n\n")[1].splitlines()
    assert lines[0].startswith(f"- ❌ 1 regression of {CANDIDATE}: 0 tests that passed on {BASELINE}")
    assert "and 1 checkpoint direction broken (rollback)" in lines[0]
    assert lines[1].startswith(f"- ❌ rollback broken, caused by {CANDIDATE}'s writer: checkpoints written by")
    assert "rolling the pin back from 2.14.1 to 2.13.0 loses resume" in lines[1]
    whole = UNPACK.format(path="torch-2.14.1/checkpoints/<cell>/.metadata")
    assert lines[2] == f"  - `{whole}`", "the root cause whole, relative to the run directory"
    assert lines[3] == f"- ✅ forward: checkpoints written by {BASELINE} load exactly under {CANDIDATE}"
    assert str(run_dir) not in markdown
    page = (run_dir / "summary.html").read_text()
    assert page.index('<h2 class="verdict">') < page.index('<table id="totals">') < page.index('<table id="grid">')
    assert f"<code>{whole.replace('<', '&lt;').replace('>', '&gt;')}</code>" in page
    assert str(run_dir) not in page, "the run's own paths are relative (the matrix file is named as is)"


def test_the_grid_and_totals_give_the_directions_their_own_column_and_row(tmp_path):
    run_dir = write_broken_rollback(tmp_path / "project")
    markdown = (run_dir / "summary.md").read_text()
    header = f"| cell | `{BASELINE}` | `{CANDIDATE}` | `rollback {CANDIDATE}→{BASELINE}` | `forward {BASELINE}→{CANDIDATE}` |"
    assert header in markdown
    # The baseline's own column is green: its write passed; the break is in the rollback column.
    assert f"| `{CELLS[0].id}` | ✅ | ✅ | ❌ | ✅ |" in markdown
    assert f"| `rollback {CANDIDATE}→{BASELINE}` | `2.13.0+cpu` |" in markdown
    page = (run_dir / "summary.html").read_text()
    assert f"<th><code>rollback {CANDIDATE}→{BASELINE}</code></th>" in page
    diff = upgrade_diffs(load_run(run_dir))[0]
    assert (diff.regression_count, diff.regressions, diff.only_before, diff.only_after) == (1, [], 0, 0)
    assert [(d.name, d.candidate, d.changed) for d in diff.broken_directions] == [("rollback", CANDIDATE, "writer")]


def test_junit_has_one_testsuite_per_direction_and_cell_and_validates(tmp_path):
    run_dir = write_broken_rollback(tmp_path / "project")
    merged = JUnitXml.fromfile(str(run_dir / "junit.xml"))
    names = [suite.name for suite in merged]
    assert len(names) == len(set(names)), "no two testsuites share a name"
    cell = CELLS[0].id
    assert {f"torch-{BASELINE}/{cell}", f"torch-{CANDIDATE}/{cell}"} < set(names)
    rollback = next(s for s in merged if s.name == f"rollback/{CANDIDATE}→{BASELINE}/{cell}")
    properties = {p.name: p.value for p in rollback.properties()}
    assert (properties["checkpoint.direction"], properties["checkpoint.attributed_to"]) == ("rollback", CANDIDATE)
    assert (rollback.failures, rollback.tests) == (1, 1)
    forward = next(s for s in merged if s.name == f"forward/{BASELINE}→{CANDIDATE}/{cell}")
    assert (forward.failures, forward.tests) == (0, 1)
    assert next(s for s in merged if s.name == f"torch-{BASELINE}/{cell}").failures == 0
    SCHEMA.assertValid(etree.parse(str(run_dir / "junit.xml")))


def test_the_terminal_names_the_direction_and_the_path_relative(tmp_path):
    run_dir = write_broken_rollback(tmp_path / "project")
    lines = closing_lines(load_run(run_dir), run_dir).splitlines()
    cause = lines[lines.index("torchmatrix: failures by root cause (1):") + 1]
    assert cause.startswith(
        f"  4 tests in 4 cells, rollback {CANDIDATE}→{BASELINE}: CheckpointException: global metadata read failed at "
        f"torch-{CANDIDATE}/checkpoints/"
    ), cause
