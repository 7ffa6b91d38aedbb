"""Cell reports a killed runner never wrote, rebuilt by `torchmatrix report` from what is on disk.

The runner writes each cell's JUnit file as the cell finishes and plan.json before any cell runs;
its pytest processes append every result to their event logs as it happens. When the runner
itself dies (SIGKILL, a lost node), `report` replays those logs: tests that reported keep their
results, and every planned cell without a file gets one, its unfinished tests as errors saying so,
stamped with when its first test started as the log recorded it (not when it was rebuilt).
"""

from __future__ import annotations

from pathlib import Path

from torchmatrix.env.devices import Environment
from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.config import Suite
from torchmatrix.matrix.plan import plan_runs
from torchmatrix.matrix.safe_names import UnsafeName, check_name
from torchmatrix.messages.events import EventReader
from torchmatrix.messages.run_plan import FILE_NAME, PlanFileError, RunPlan, read_plan
from torchmatrix.reports import junit
from torchmatrix.reports.report import refuse_while_running, write_report
from torchmatrix.run import confirmation
from torchmatrix.run.outcomes import OutcomeBook
from torchmatrix.status import Status

UNFINISHED = "the runner stopped before this suite finished (killed or its machine lost); rebuilt from the event log by `torchmatrix report`"


def rebuild_and_report(run_dir: Path, config: str | None = None) -> list[Path]:
    """`torchmatrix report`: rebuild the cells a killed runner left without a report, then write
    every report file of the run (refused while a runner still writes to it)."""
    refuse_while_running(run_dir)
    rebuild_missing_cells(run_dir)
    return write_report(run_dir, config)


def rebuild_missing_cells(run_dir: Path) -> list[Path]:
    """Write the JUnit file of every planned cell that has none, from the event logs; return them."""
    written = []
    for plan_path in sorted(run_dir.glob(f"torch-*/{FILE_NAME}")):
        plan = read_plan(plan_path)
        version_dir = plan_path.parent
        if all((version_dir / f"{cell}.xml").is_file() for cell in plan.cells):
            continue
        cells, suites = _planned(plan, plan_path)
        book = OutcomeBook(plan_runs(cells, suites))
        for events in _main_event_logs(version_dir / "logs"):
            try:
                for event in EventReader(events).read_new():
                    book.feed(event, 0.0)
            except (KeyError, TypeError, ValueError) as error:
                raise PlanFileError(
                    f"{events}: not an event log this run wrote ({error!r}); rerun that torch version"
                ) from None
        for key in book.runs:
            if not book.is_done(key):
                book.fail_run(key, Status.ERROR, UNFINISHED)
        environment = plan.environment or Environment.without_torch("unknown")
        for cell in cells:
            if not (version_dir / f"{cell.id}.xml").is_file():
                written.append(
                    junit.write_cell(
                        version_dir, plan.torch, environment, cell, book.for_cell(cell), book.cell_started(cell)
                    )
                )
    return written


def _planned(plan: RunPlan, path: Path) -> tuple[list[Cell], dict[str, Suite]]:
    """The cells and suites plan.json recorded, checked as names before they become file names."""
    try:
        cells = [Cell(axes) for axes in plan.cell_axes]
        for cell in cells:
            check_name(cell.id, "cell id")
        suites = {
            check_name(name, "suite name"): Suite(name, spec.path, spec.timeout, spec.axes)
            for name, spec in plan.suites.items()
        }
    except (UnsafeName, TypeError, KeyError, ValueError) as error:
        raise PlanFileError(f"{path}: cannot rebuild its cells ({error}); rerun that torch version") from None
    if [cell.id for cell in cells] != list(plan.cells):
        raise PlanFileError(f"{path}: cell_axes and cells disagree; rerun that torch version")
    return cells, suites


def _main_event_logs(logs: Path) -> list[Path]:
    """Event logs of the cell runs; those of confirmation re-runs are left out."""
    return [
        events
        for events in sorted(logs.glob("*.events.jsonl"))
        if not events.name.startswith(confirmation.GROUP_PREFIX)
    ]
