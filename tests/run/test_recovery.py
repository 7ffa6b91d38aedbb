"""`report` after a killed runner: cells rebuilt from the event logs keep when they really started."""

from __future__ import annotations

from torchmatrix.env.devices import Environment
from torchmatrix.matrix.config import load_matrix
from torchmatrix.matrix.plan import Group, plan_runs
from torchmatrix.messages.events import Collected, EventLog, TestFinished, TestStarted
from torchmatrix.messages.run_plan import PlannedSuite, RunPlan, write_plan
from torchmatrix.reports import junit
from torchmatrix.run.pytest_command import events_path, group_command
from torchmatrix.run.recovery import UNFINISHED, rebuild_missing_cells

from helpers.matrix_files import write_matrix

STARTED = 1767323045.0  # 2026-01-02T03:04:05+00:00, long before any test runs this


def test_a_rebuilt_cell_is_stamped_when_its_tests_started_not_when_it_was_rebuilt(tmp_path):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "test_demo.py").write_text("")
    matrix = load_matrix(
        str(
            write_matrix(
                tmp_path, axes={"world_size": [1], "fsdp": ["none", "fsdp2"]}, suites={"demo": {"timeout": 10}}
            )
        )
    )
    cells = matrix.cells()
    version_dir = tmp_path / "reports" / "killed" / "torch-system"
    logs = version_dir / "logs"
    logs.mkdir(parents=True)
    write_plan(
        version_dir,
        RunPlan(
            torch="system",
            cells=tuple(cell.id for cell in cells),
            cell_axes=tuple(dict(cell) for cell in cells),
            suites={name: PlannedSuite(s.path, s.timeout, tuple(s.axes)) for name, s in matrix.suites.items()},
        ),
    )
    runs = plan_runs(cells, matrix.suites)
    group = Group("ws1", 1, tuple(runs))
    group_command(matrix, "system", group, Environment(torch="2.13.0+cpu"), logs)
    log = EventLog(events_path(logs, group))
    log.write(Collected({run.key: ["test_one", "test_two"] for run in runs}))
    for offset, run in ((0.0, runs[0]), (30.0, runs[1])):
        log.write(TestStarted("demo", run.cell.id, "test_one", started=STARTED + offset))
        log.write(TestFinished("demo", "test_one", "passed", 0.1, nodeid="n", cell=run.cell.id))
    log.write(TestStarted("demo", runs[1].cell.id, "test_two", started=STARTED + 31.0))
    log.close()  # the runner was killed during test_two of the second cell

    rebuilt = rebuild_missing_cells(version_dir.parent)

    suites = {suite.name: suite for path in rebuilt for suite in junit.read_suites(path)}
    assert [suite.timestamp for suite in suites.values()] == ["2026-01-02T03:04:05+00:00", "2026-01-02T03:04:35+00:00"]
    unfinished = next(case for case in suites["torch-system/ws1-fsdp2"] if case.name.startswith("test_two"))
    assert unfinished.result[0].message == UNFINISHED
