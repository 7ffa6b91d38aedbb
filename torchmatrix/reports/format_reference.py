"""The report formats as the reference pages show them, rendered from what the writers produce for
one example cell, so that a key or property the code adds or renames shows up in the docs."""

from __future__ import annotations

import json

from torchmatrix.env.devices import Environment
from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.config import ReportSettings, Suite
from torchmatrix.matrix.plan import SuiteRun
from torchmatrix.messages.events import TestOutcome
from torchmatrix.reports.junit import cell_report, direction_suites
from torchmatrix.reports.records import RunResults, TestRecord, VersionInfo
from torchmatrix.reports.results_json import to_json
from torchmatrix.status import Confirmation, Status

VERSION = "2.13.0"
ENVIRONMENT = Environment(torch="2.13.0+cpu", git_version="5ac3a6a")
CELL = Cell({"world_size": 2, "fsdp": "fsdp2"})
REPRESENTATIVE = Cell({"world_size": 2, "fsdp": "fsdp1"})
SUITE, TEST = "grad_ckpt", "test_checkpointing_leaves_loss_and_gradients_unchanged[0.0]"
# Name -> value maps whose keys are the run's own (figure names, axis names), shown whole.
OPEN_MAPS = ("figures", "axes", "filters")


def junit_properties() -> str:
    """The example cell's <testsuite> name, its properties and its testcase's name, as cell_report writes them."""
    run = SuiteRun(Suite(SUITE, "", 120, ("world_size",)), REPRESENTATIVE, (REPRESENTATIVE, CELL))
    outcome = TestOutcome(
        SUITE,
        TEST,
        Status.FAILED,
        message="AssertionError: gradients differ",
        properties=[("grad_max_ulp", "3")],
        confirmation=Confirmation.FAILS_ALONE,
    )
    suite = cell_report(VERSION, ENVIRONMENT, CELL, [(run, outcome)], started=0)
    case = next(iter(suite))
    rows = ["| where | name | example value |", "|---|---|---|"]
    rows.append(f"| `<testsuite name>` | | `{suite.name}` |")
    rows += [f"| `<property>` | `{p.name}` | `{p.value}` |" for p in suite.properties()]
    rows.append(f"| `<testcase name>` | | `{case.name}` |")
    rows.append(f"| `<testcase classname>` | | `{case.classname}` |")
    return "\n".join(rows)


def junit_direction_properties() -> str:
    """The testsuite a read of another version's checkpoint lands in: the example cell's rollback
    testsuite (torch 2.13.0, the baseline, reading what 2.15.0 wrote), as merge_run writes it."""
    run = SuiteRun(Suite("cross_version", "", 120, ("world_size", "fsdp")), CELL, (CELL,))
    outcome = TestOutcome(
        "cross_version",
        "test_loads_checkpoint_written_by[writer=2.15.0]",
        Status.FAILED,
        message="CheckpointException: global metadata read failed: too many values to unpack (expected 5)",
    )
    (suite,) = direction_suites(cell_report(VERSION, ENVIRONMENT, CELL, [(run, outcome)], started=0), VERSION)
    case = next(iter(suite))
    rows = ["| where | name | example value |", "|---|---|---|"]
    rows.append(f"| `<testsuite name>` | | `{suite.name}` |")
    rows += [
        f"| `<property>` | `{p.name}` | `{p.value}` |" for p in suite.properties() if not p.name.startswith("axis.")
    ]
    rows.append(f"| `<testcase name>` | | `{case.name}` |")
    return "\n".join(rows)


def results_json_keys() -> str:
    """Every key of the results.json to_json writes for the example run (one test), with its JSON value."""
    record = TestRecord(VERSION, CELL.id, SUITE, TEST, Status.PASSED, 1.25, ran_in=REPRESENTATIVE.id)
    record.figures["grad_max_ulp"] = 0
    results = RunResults(
        run_id="20261124-101500-4242",
        created="2026-11-24T10:15:00+00:00",
        hosts=["node-1"],
        matrix_path="matrix.toml",
        matrix_sha256="<sha256 of matrix.toml>",
        baseline=VERSION,
        settings=ReportSettings(),
        versions=[VersionInfo(VERSION, ENVIRONMENT, planned_cells=(CELL.id,), pool_starts=1)],
        cells={CELL.id: {axis: str(value) for axis, value in CELL.items()}},
        tests=[record],
    )
    rows = ["| key | example value |", "|---|---|"]
    rows += [f"| `{path}` | `{json.dumps(value)}` |" for path, value in _leaves(to_json(results), "")]
    return "\n".join(rows)


def _leaves(value, path: str):
    """(path, value) for every scalar, empty container and open map, lists shown by their first item."""
    if isinstance(value, dict) and value and path.rsplit(".", 1)[-1] not in OPEN_MAPS:
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        yield from _leaves(value[0], f"{path}[]")
    else:
        yield path, value
