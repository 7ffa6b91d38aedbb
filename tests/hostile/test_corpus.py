"""Hostile and unlucky inputs that stop before any cell runs: each case is data (what it does, the
command, the exit code, the one-line message), and the runner must answer with exactly one
`torchmatrix: error:` line, no traceback, and write nothing outside the reports directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers.checkout import checkout_env
from helpers.cli_forks import CliForks
from helpers.projects import Project
from helpers.results_documents import results_document

MATRIX = """
[torch]
versions = ["2.13.0"]

[axes]
world_size = [1, 2]
fsdp = ["none", "fsdp2"]

[suites.demo]
path = "suites/test_demo.py"
{suite_extra}
{extra}
"""

SUITE = "def test_demo(cell):\n    pass\n"


@dataclass
class Case:
    """One hostile input: the files it writes (relative to the project), the command, what must come back."""

    id: str
    what: str
    args: list[str]
    exit_code: int
    message: str
    extra: str = ""
    suite_extra: str = ""
    files: dict[str, str] = field(default_factory=dict)


def _plan(**overrides) -> str:
    plan = {"torch": "2.13.0", "matrix_sha256": "SHA", "cells": ["ws1-none"], "environment": {}, "shard": None}
    return json.dumps({**plan, **overrides})


def _results(**overrides) -> str:
    return json.dumps({**results_document(schema_version=2), **overrides})


TRUNCATED_XML = '<testsuites><testsuite name="torch-2.13.0/ws1-none"'
EXTERNAL_ENTITY_XML = (
    '<?xml version="1.0"?><!DOCTYPE t [<!ENTITY secret SYSTEM "file:///etc/passwd">]>'
    '<testsuites><testsuite name="&secret;"><testcase name="t"/></testsuite></testsuites>'
)
BILLION_LAUGHS_XML = (
    '<?xml version="1.0"?><!DOCTYPE l [<!ENTITY l0 "ha">'
    + "".join(f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, 10))
    + ']><testsuites><testsuite name="&l9;"/></testsuites>'
)

NOISY_COMPONENT = """
import atexit
import sys

sys.stdout.write("loading...")
atexit.register(print, '{"device_type": "cpu", "problems": [], "missing": []}')


def build_model(cell, *, dtype, dropout=0.0):
    return None
"""
CELL_AXES = {"world_size": 1, "fsdp": "none"}
TEST_RECORD = {"torch": "2.13.0", "cell": "ws1", "suite": "s", "test": "t", "status": "passed", "duration": 1.0}

CASES = [
    Case(
        "merge-torch-pin-escapes",
        "a plan.json whose torch version is ../../.. would make merge write outside --out",
        ["merge", "in", "--out", "merged"],
        2,
        "torch version '../../..' cannot be a file name",
        files={"in/torch-2.13.0/plan.json": _plan(torch="../../..")},
    ),
    Case(
        "merge-torch-pin-not-its-directory",
        "a plan.json naming another version than its torch-* directory",
        ["merge", "in", "--out", "merged"],
        2,
        "is not the 'torch-2.13.0' its directory names",
        files={"in/torch-2.13.0/plan.json": _plan(torch="2.14.1")},
    ),
    Case(
        "merge-cell-id-escapes",
        "a plan.json listing a cell id with a path in it",
        ["merge", "in", "--out", "merged"],
        2,
        "cell id '../../evil' cannot be a file name",
        files={"in/torch-2.13.0/plan.json": _plan(cells=["../../evil"])},
    ),
    Case(
        "merge-suite-name-escapes",
        "a plan.json naming a suite with a path in it",
        ["merge", "in", "--out", "merged"],
        2,
        "suite name '../s' cannot be a file name",
        files={"in/torch-2.13.0/plan.json": _plan(suites={"../s": {}})},
    ),
    Case(
        "merge-plan-not-json",
        "a truncated plan.json",
        ["merge", "in", "--out", "merged"],
        2,
        "not a readable plan",
        files={"in/torch-2.13.0/plan.json": '{"torch": "2.13'},
    ),
    Case(
        "merge-versions-escapes",
        "merge --versions with a path would write plan.json and cell reports outside --out",
        ["merge", "in", "--out", "merged", "--versions", "1/../../../../escaped"],
        2,
        "--versions entry '1/../../../../escaped' cannot be a file name",
        files={"in/torch-2.13.0/plan.json": _plan()},
    ),
    Case(
        "run-id-latest",
        "--run-id latest would make reports/latest a link to itself",
        ["run", "--torch", "2.13.0", "--run-id", "latest"],
        2,
        "--run-id 'latest': reports/latest is the link to the last finished run; choose another run id",
    ),
    Case(
        "run-id-inside-slurm-scripts",
        "--run-id slurm/x would put a run among the sbatch scripts",
        ["run", "--torch", "2.13.0", "--run-id", "slurm/x"],
        2,
        "reports/slurm is where `torchmatrix slurm` writes its scripts",
    ),
    Case(
        "run-id-escapes-reports",
        "--run-id ../../x would put the run directory outside reports/",
        ["run", "--torch", "2.13.0", "--run-id", "../../x"],
        2,
        "--run-id '../../x' would leave the reports directory",
    ),
    Case(
        "run-id-absolute",
        "--run-id /tmp/x",
        ["run", "--torch", "2.13.0", "--run-id", "/tmp/x"],
        2,
        "--run-id '/tmp/x' would leave the reports directory",
    ),
    Case(
        "suite-symlink-outside-project",
        "a suite path that is a symlink to a file outside the project",
        ["list"],
        2,
        "outside the project",
        files={"@suites/test_demo.py": "../../outside/test_demo.py"},
    ),
    Case(
        "project-root-not-a-directory",
        "[project] root naming nothing",
        ["list"],
        2,
        "project.root: 'nowhere' is not a directory",
        extra='[project]\nroot = "nowhere"',
    ),
    Case(
        "slurm-partition-newline",
        "--partition with a newline and a command would add lines to every sbatch script",
        ["slurm", "--gpus-per-node", "2", "--partition", "gpu\n#SBATCH --wrap=rm -rf ~"],
        2,
        "is not a partition name",
    ),
    Case(
        "slurm-partition-shell",
        "--partition with shell metacharacters",
        ["slurm", "--gpus-per-node", "2", "--partition", "gpu;touch pwned"],
        2,
        "is not a partition name",
    ),
    Case(
        "slurm-time-newline",
        "--time with a newline",
        ["slurm", "--gpus-per-node", "2", "--time", "01:00:00\nrm -rf ~"],
        2,
        "is not a Slurm time limit",
    ),
    Case(
        "compare-results-not-an-object",
        "compare of a results.json that is a JSON list",
        ["compare", "a.json", "b.json"],
        2,
        "not a JSON object",
        files={"a.json": "[]", "b.json": "[]"},
    ),
    Case(
        "compare-results-missing-run",
        "compare of a results.json without its run table",
        ["compare", "a.json", "a.json"],
        2,
        "malformed (missing key 'run')",
        files={"a.json": json.dumps({"schema": "torchmatrix.results", "schema_version": 2})},
    ),
    Case(
        "compare-results-bad-status",
        "compare of a results.json whose test has an unknown status",
        ["compare", "a.json", "a.json"],
        2,
        "tests[].status 'exploded' is not one of",
        files={"a.json": _results(tests=[{**TEST_RECORD, "status": "exploded"}])},
    ),
    Case(
        "compare-results-bad-duration",
        "compare of a results.json whose duration is text",
        ["compare", "a.json", "a.json"],
        2,
        "tests[].duration 'slow' is not a number",
        files={"a.json": _results(tests=[{**TEST_RECORD, "duration": "slow"}])},
    ),
    Case(
        "compare-results-bad-threshold",
        "compare of a results.json whose slowdown threshold is text (the diff would format it as a number)",
        ["compare", "a.json", "a.json"],
        2,
        "run.thresholds.slowdown_ratio 'x' is not a positive number",
        files={
            "a.json": _results(
                run={**json.loads(_results())["run"], "thresholds": {"drift_ratio": 10.0, "slowdown_ratio": "x"}}
            )
        },
    ),
    Case(
        "compare-results-bad-confirmation",
        "compare of a results.json whose test has an unknown confirmation",
        ["compare", "a.json", "a.json"],
        2,
        "tests[].confirmation 'weird' is not one of: '', 'fails alone'",
        files={"a.json": _results(tests=[{**TEST_RECORD, "status": "failed", "confirmation": "weird"}])},
    ),
    Case(
        "compare-results-truncated",
        "compare of a truncated results.json",
        ["compare", "a.json", "a.json"],
        2,
        "cannot read",
        files={"a.json": '{"schema": '},
    ),
    Case(
        "only-value-that-does-not-exist",
        "--only world_size=3 when 3 is not a world size",
        ["list", "--only", "world_size=3"],
        2,
        "--only world_size=3 selects no cell; world_size has: 1, 2",
    ),
    Case(
        "only-values-never-together",
        "--only values that exist but never in one cell",
        ["list", "--only", "world_size=1", "--only", "fsdp=fsdp2"],
        2,
        "each value exists, but no cell has them together",
        extra='[[exclude]]\nworld_size = 1\nfsdp = "fsdp2"',
    ),
    Case(
        "keyword-matches-nothing",
        "-k that matches no cell id",
        ["list", "-k", "nothing"],
        2,
        "-k 'nothing' matches none of the 4 cell ids",
    ),
    Case(
        "run-keyword-matches-nothing",
        "run with -k that matches no cell id (used to exit 0 with 0 cells)",
        ["run", "--torch", "2.13.0", "-k", "nothing"],
        2,
        "-k 'nothing' matches none of the 4 cell ids",
    ),
    Case(
        "toml-datetime-in-options",
        "a TOML datetime in a suite's options (JSON cannot carry it to the suite)",
        ["list"],
        2,
        "suites.demo.options.when: 1979-05-27T07:32:00 is a TOML date",
        suite_extra="options = { when = 1979-05-27T07:32:00 }",
    ),
    Case(
        "toml-date-in-nested-options",
        "a TOML date inside an array of a suite's options",
        ["list"],
        2,
        "suites.demo.options.days[0]: 1979-05-27 is a TOML date",
        suite_extra="options = { days = [1979-05-27] }",
    ),
    Case(
        "toml-datetime-as-timeout",
        "a TOML datetime as the per-test deadline",
        ["list"],
        2,
        "suites.demo.timeout: datetime.datetime(1979, 5, 27",
        suite_extra="timeout = 1979-05-27T07:32:00",
    ),
    Case(
        "toml-datetime-as-axis-value",
        "a TOML time as an axis value",
        ["list"],
        2,
        "axes.when[0]: datetime.time(7, 32) is not a valid axis value",
    ),
    Case(
        "timeout-inf",
        "timeout = inf (a test that hangs would never end)",
        ["list"],
        2,
        "suites.demo.timeout: inf is not a positive number",
        suite_extra="timeout = inf",
    ),
    Case(
        "timeout-nan",
        "timeout = nan",
        ["list"],
        2,
        "suites.demo.timeout: nan is not a positive number",
        suite_extra="timeout = nan",
    ),
    Case(
        "timeout-negative",
        "timeout = -5",
        ["list"],
        2,
        "suites.demo.timeout: -5 is not a positive number",
        suite_extra="timeout = -5",
    ),
    Case(
        "timeout-beyond-a-day",
        "timeout = 3000000 (finite, but the pool's waits would overflow the OS timers)",
        ["list"],
        2,
        "suites.demo.timeout: 3000000 seconds is more than a day per test; set at most 86400",
        suite_extra="timeout = 3000000",
    ),
    Case(
        "drift-ratio-inf",
        "[report] drift_ratio = inf",
        ["list"],
        2,
        "report.drift_ratio: inf is not a positive number",
        extra="[report]\ndrift_ratio = inf",
    ),
    Case(
        "negative-axis-value",
        "a negative number as an axis value would give ids like ws2--1",
        ["list"],
        2,
        "axes.lr_shift[1]: -1 is not a valid axis value",
    ),
    Case(
        "exponent-axis-value",
        "a float whose spelling has '-' (1e-05)",
        ["list"],
        2,
        "1e-05 is not a valid axis value",
    ),
    Case(
        "slots-zero",
        "--slots 0 would never start a cell",
        ["run", "--torch", "2.13.0", "--slots", "0"],
        2,
        "argument --slots: 0 is not positive",
    ),
    Case(
        "slots-negative",
        "--slots -1",
        ["run", "--torch", "2.13.0", "--slots=-1"],
        2,
        "argument --slots: -1 is not positive",
    ),
    Case(
        "run-torch-escapes-with-peer",
        "--torch naming a path, with --peer (which lets --torch name a release matrix.toml does not list)",
        ["run", "--torch", "/../../../../escaped", "--peer", "2.13.0", "--run-id", "r"],
        2,
        "argument --torch: '/../../../../escaped' is not a torch version pip can install",
    ),
    Case(
        "run-peer-escapes",
        "--peer naming a path (the read pass looks for torch-<peer>/checkpoints)",
        ["run", "--torch", "2.13.0", "--peer", "../../x", "--run-id", "r"],
        2,
        "argument --peer: '../../x' is not a torch version pip can install",
    ),
    *(
        Case(
            f"{arguments[0]}-plan-is-a-pipe",
            "a named pipe at torch-V/plan.json (reading it would wait forever)",
            arguments,
            2,
            "plan.json is a named pipe, not a file of the run; remove it, or rerun that torch version",
            files={"|reports/r/torch-2.13.0/plan.json": ""},
        )
        for arguments in (
            ["report", "reports/r"],
            ["compare", "reports/r", "reports/r"],
            ["merge", "reports/r", "--out", "reports/merged"],
            ["repro", "reports/r", "2.13.0/ws1-none/demo::test_demo"],
            ["cross-read", "reports/r"],
        )
    ),
    Case(
        "report-lock-is-a-pipe",
        "a named pipe at torch-V/.run.lock (opening it to see who runs would wait forever)",
        ["report", "reports/r"],
        2,
        ".run.lock is a named pipe, not a file of the run; remove it, or rerun that torch version",
        files={"reports/r/torch-2.13.0/plan.json": _plan(), "|reports/r/torch-2.13.0/.run.lock": ""},
    ),
    Case(
        "run-lock-is-a-pipe",
        "a named pipe at torch-V/.run.lock (opening it to see who runs would wait forever)",
        ["run", "--torch", "2.13.0", "--run-id", "r", "--restart"],
        2,
        ".run.lock is a named pipe, not a file of the run; remove it, or rerun that torch version",
        files={"reports/r/torch-2.13.0/plan.json": _plan(), "|reports/r/torch-2.13.0/.run.lock": ""},
    ),
    Case(
        "cross-read-not-a-run-directory",
        "cross-read of a path that is not a run directory",
        ["cross-read", "reports/nowhere"],
        2,
        "reports/nowhere is not a run directory; pass one under reports/",
    ),
    Case(
        "cross-read-not-a-run",
        "cross-read of a directory that holds no torch-*/plan.json",
        ["cross-read", "suites"],
        2,
        "suites is not a run directory (no torch-*/plan.json in it)",
    ),
    Case(
        "cross-read-truncated-plan",
        "cross-read of a run whose plan.json is cut off",
        ["cross-read", "reports/r"],
        2,
        "torch-2.13.0/plan.json: not a readable plan",
        files={"reports/r/torch-2.13.0/plan.json": '{"torch": "2.1'},
    ),
    Case(
        "report-planned-cell-report-is-a-directory",
        "a planned cell's <cell>.xml that is a directory, which the report would rebuild",
        ["report", "reports/r"],
        2,
        "ws1-none.xml is a directory where a file goes; remove it",
        files={
            "reports/r/torch-2.13.0/plan.json": _plan(cell_axes=[CELL_AXES], finished=True),
            "reports/r/torch-2.13.0/ws1-none.xml/": "",
        },
    ),
    Case(
        "report-summary-is-a-directory",
        "a summary.md that is a directory",
        ["report", "reports/r", "--config", "matrix.toml"],
        2,
        "summary.md is a directory where a file goes; remove it",
        files={
            "reports/r/torch-2.13.0/plan.json": _plan(cell_axes=[CELL_AXES], finished=True),
            "reports/r/summary.md/": "",
        },
    ),
    Case(
        "compare-out-is-a-directory",
        "compare --out naming a directory",
        ["compare", "a.json", "a.json", "--out", "suites"],
        2,
        "--out suites is a directory; name a file, e.g. --out suites/compare.md",
        files={"a.json": _results(tests=[TEST_RECORD])},
    ),
    Case(
        "compare-out-in-a-missing-directory",
        "compare --out naming a file in a directory that does not exist",
        ["compare", "a.json", "a.json", "--out", "missing/x.md"],
        2,
        "--out missing/x.md: the directory missing does not exist",
        files={"a.json": _results(tests=[TEST_RECORD])},
    ),
    Case(
        "torch-version-typo",
        "a torch version with its local label typed without '+' (nox would die installing it)",
        ["list"],
        2,
        """torch.versions[0]: '2.13.0cu121' is not a PEP 440 torch version pip can install; did you mean "2.13.0+cu121"?""",
        files={"matrix.toml": MATRIX.format(suite_extra="", extra="").replace('"2.13.0"', '"2.13.0cu121"')},
    ),
    Case(
        "matrix-too-large",
        "axes that multiply to 4 x 10^7 cells (listing them would need tens of GB)",
        ["list", "-k", "ws1"],
        2,
        "without --only, this matrix has 40,000,000 cells for -k to read",
    ),
    Case(
        "matrix-too-large-unfiltered",
        "axes that multiply to 4 x 10^7 cells, listed whole",
        ["list"],
        2,
        "over the 200,000 torchmatrix expands; narrow this command with --only or -k",
    ),
    Case(
        "component-prints-forged-answer-at-exit",
        "a component module that prints at import without a newline and prints a forged check answer at exit",
        ["run", "--torch", "2.13.0"],
        2,
        "components.model: 'noisy' has no attribute 'build_modle'; did you mean 'build_model'?",
        extra='[components]\nmodel = "noisy:build_modle"',
        files={"noisy.py": NOISY_COMPONENT},
    ),
    Case(
        "component-exits-at-import",
        "a component module that exits at import, so the check never answers",
        ["run", "--torch", "2.13.0"],
        2,
        "components: the check could not run with",
        extra='[components]\nmodel = "quits:build_model"',
        files={"quits.py": "import sys\n\nprint('{}')\nsys.exit(3)\n"},
    ),
    Case(
        "github-matrix-only-system",
        "github-matrix when [torch] lists only 'system' (GitHub rejects an empty job matrix)",
        ["github-matrix"],
        2,
        "[torch].versions of matrix.toml lists only 'system'; each job installs one pinned torch version",
        files={"matrix.toml": MATRIX.format(suite_extra="", extra="").replace('"2.13.0"', '"system"')},
    ),
    Case(
        "report-truncated-cell-xml",
        "a cell report cut off mid-tag",
        ["report", "runs/r"],
        2,
        "ws1-none.xml is not readable JUnit XML (",
        files={"runs/r/torch-2.13.0/ws1-none.xml": TRUNCATED_XML},
    ),
    Case(
        "report-external-entity",
        "a cell report whose DOCTYPE declares an external entity",
        ["report", "runs/r"],
        2,
        "ws1-none.xml is not readable JUnit XML (",
        files={"runs/r/torch-2.13.0/ws1-none.xml": EXTERNAL_ENTITY_XML},
    ),
    Case(
        "report-billion-laughs",
        "a cell report whose entities expand to gigabytes",
        ["report", "runs/r"],
        2,
        "ws1-none.xml is not readable JUnit XML (",
        files={"runs/r/torch-2.13.0/ws1-none.xml": BILLION_LAUGHS_XML},
    ),
    Case(
        "report-cell-report-is-a-directory",
        "a <cell>.xml that is a directory",
        ["report", "runs/r"],
        2,
        "ws1-none.xml is not a regular file (a directory or a pipe?)",
        files={"runs/r/torch-2.13.0/ws1-none.xml/": ""},
    ),
    Case(
        "merge-truncated-cell-xml",
        "merge of a truncated cell report",
        ["merge", "in", "--out", "merged"],
        2,
        "ws1-none.xml is not readable JUnit XML (",
        files={"in/torch-2.13.0/plan.json": _plan(), "in/torch-2.13.0/ws1-none.xml": TRUNCATED_XML},
    ),
    Case(
        "merge-billion-laughs",
        "merge of a cell report whose entities expand to gigabytes",
        ["merge", "in", "--out", "merged"],
        2,
        "ws1-none.xml is not readable JUnit XML (",
        files={"in/torch-2.13.0/plan.json": _plan(), "in/torch-2.13.0/ws1-none.xml": BILLION_LAUGHS_XML},
    ),
    Case(
        "merge-cell-report-is-a-directory",
        "merge of a <cell>.xml that is a directory",
        ["merge", "in", "--out", "merged"],
        2,
        "ws1-none.xml is a symlink, a directory or a pipe; a cell report must be a file",
        files={"in/torch-2.13.0/plan.json": _plan(), "in/torch-2.13.0/ws1-none.xml/": ""},
    ),
    Case(
        "merge-cell-report-is-a-fifo",
        "merge of a <cell>.xml that is a named pipe (reading it would block forever)",
        ["merge", "in", "--out", "merged"],
        2,
        "ws1-none.xml is a symlink, a directory or a pipe; a cell report must be a file",
        files={"in/torch-2.13.0/plan.json": _plan(), "|in/torch-2.13.0/ws1-none.xml": ""},
    ),
    Case(
        "config-dev-zero",
        "--config /dev/zero would read without bound",
        ["list", "--config", "/dev/zero"],
        2,
        "/dev/zero: not a regular file (a device, a pipe or a directory); pass --config FILE",
    ),
    Case(
        "config-fifo",
        "--config naming a named pipe would block forever",
        ["list", "--config", "matrix.fifo"],
        2,
        "matrix.fifo: not a regular file (a device, a pipe or a directory); pass --config FILE",
        files={"|matrix.fifo": ""},
    ),
    Case(
        "config-huge",
        "--config naming a 5 MiB file",
        ["list", "--config", "huge.toml"],
        2,
        "huge.toml: over 4 MiB, not a matrix file; pass --config FILE",
        files={"huge.toml": "#" * (5 * 2**20)},
    ),
    Case(
        "config-path-with-newline",
        "a --config path with a newline would split the one-line error",
        ["list", "--config", "bad\nname.toml"],
        2,
        "bad\\nname.toml': cannot read the matrix file (No such file or directory)",
    ),
    Case(
        "axis-named-id",
        "an axis named id would replace the cell ids in `list --json`",
        ["list", "--json"],
        2,
        "matrix.toml: axes.id: is the key that holds the cell id in `list --json`; rename the axis",
    ),
    Case(
        "sensitivity-shard",
        "sensitivity --shard (it picks its own cells)",
        ["sensitivity", "--shard", "1/2"],
        2,
        "sensitivity: --shard does not apply",
    ),
    Case(
        "shards-zero",
        "github-matrix --shards 0",
        ["github-matrix", "--shards", "0"],
        2,
        "argument --shards: 0 is not positive",
    ),
]

HUGE_AXES = 'world_size = [1, 2]\nfsdp = ["none", "fsdp2"]\n' + "".join(
    f"a{i} = {json.dumps([f'v{i}{j}' for j in range(10)])}\n" for i in range(7)
)  # 4 x 10^7 cells
# Axis-level cases replace the [axes] table: written here, where the TOML needs it whole.
AXES = {
    "axis-named-id": 'world_size = [1, 2]\nfsdp = ["none", "fsdp2"]\nid = ["a", "b"]',
    "toml-datetime-as-axis-value": 'world_size = [1, 2]\nfsdp = ["none", "fsdp2"]\nwhen = [07:32:00]',
    "negative-axis-value": 'world_size = [1, 2]\nfsdp = ["none", "fsdp2"]\nlr_shift = [0, -1]',
    "exponent-axis-value": 'world_size = [1, 2]\nfsdp = ["none", "fsdp2"]\nlr = [1e-05]',
    "matrix-too-large": HUGE_AXES,
    "matrix-too-large-unfiltered": HUGE_AXES,
}


def _write(project: Project, case: Case) -> None:
    text = MATRIX.format(suite_extra=case.suite_extra, extra=case.extra if case.id not in AXES else "")
    if case.id in AXES:
        text = text.replace('world_size = [1, 2]\nfsdp = ["none", "fsdp2"]', AXES[case.id])
    project.write("matrix.toml", text)
    if "@suites/test_demo.py" not in case.files:
        project.write("suites/test_demo.py", SUITE)
    for relative, content in case.files.items():
        if relative.endswith("/"):  # a directory where a file belongs
            (project.root / relative).mkdir(parents=True)
        elif relative.startswith("|"):  # a named pipe
            (project.root / relative[1:]).parent.mkdir(parents=True, exist_ok=True)
            os.mkfifo(project.root / relative[1:])
        elif relative.startswith("@"):  # a symlink: content is its target
            target = project.root / Path(relative[1:]).parent / content
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(SUITE)
            (project.root / relative[1:]).symlink_to(content)
        else:
            project.write(relative, content.replace("SHA", _digest(project)))


def _digest(project: Project) -> str:
    from torchmatrix.matrix.config import load_matrix

    return load_matrix(project.root / "matrix.toml").digest


@pytest.fixture(scope="module")
def cli_forks(tmp_path_factory):
    forks = CliForks(tmp_path_factory.mktemp("cli-forks"))
    yield forks
    forks.close()


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_hostile_input_is_refused_with_one_line(tmp_path, case, cli_forks):
    project = Project(tmp_path / "project")
    _write(project, case)
    before = set(tmp_path.rglob("*"))
    done = cli_forks.run(project.root, *case.args, timeout=120)
    assert done.returncode == case.exit_code, (case.what, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, case.what
    lines = done.stderr.strip().splitlines()
    if case.message.startswith("argument "):  # argparse's own refusal: its usage, then the option it names
        assert lines[0].startswith("usage: torchmatrix"), (case.what, done.stderr)
        assert lines[-1].startswith(f"torchmatrix {case.args[0]}: error: {case.message}"), (case.what, done.stderr)
    else:
        assert len(lines) == 1 and lines[0].startswith("torchmatrix: error: "), (case.what, done.stderr)
        assert case.message in lines[0], (case.what, done.stderr)
    escaped = {path for path in set(tmp_path.rglob("*")) - before if not path.is_relative_to(project.root / "reports")}
    assert not escaped, (case.what, escaped)


def test_a_command_in_a_fork_answers_as_in_a_fresh_interpreter(tmp_path, cli_forks):
    """The forks stand in for `python -m torchmatrix` above: the same exit code and the same output."""
    project = Project(tmp_path / "project")
    _write(project, CASES[0])
    fresh = project.torchmatrix(*CASES[0].args)
    forked = cli_forks.run(project.root, *CASES[0].args, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_merge_of_a_hostile_plan_writes_nothing_outside_out(tmp_path):
    project = Project(tmp_path / "a" / "b" / "project")
    _write(project, CASES[0])
    outside = set(tmp_path.rglob("*"))
    done = project.torchmatrix("merge", "in", "--out", "merged")
    assert done.returncode == 2
    assert set(tmp_path.rglob("*")) == outside  # not even --out was created


def test_a_suite_symlink_into_the_named_project_root_is_accepted(tmp_path):
    """The documented way for scratch and example projects: [project] root names the tree the
    symlink leads into."""
    shared = tmp_path / "shared"
    (shared / "suites").mkdir(parents=True)
    (shared / "suites" / "test_demo.py").write_text(SUITE)
    project = Project(tmp_path / "shared" / "example")
    (project.root / "suites").rmdir()
    (project.root / "suites").symlink_to(shared / "suites", target_is_directory=True)
    project.write("matrix.toml", MATRIX.format(suite_extra="", extra='[project]\nroot = ".."'))
    done = project.torchmatrix("list")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ws1-none", "ws1-fsdp2", "ws2-none", "ws2-fsdp2"]
    project.write("matrix.toml", MATRIX.format(suite_extra="", extra=""))
    refused = project.torchmatrix("list")
    assert refused.returncode == 2 and "outside the project" in refused.stderr


def test_slurm_values_that_pass_are_plain(tmp_path):
    """Accepted values reach the scripts verbatim, and no script gains a line from them."""
    project = Project(tmp_path / "project")
    project.write("matrix.toml", MATRIX.format(suite_extra="", extra=""))
    project.write("suites/test_demo.py", SUITE)
    done = project.torchmatrix("slurm", "--gpus-per-node", "2", "--partition", "gpu,gpu-long", "--time", "1-12:00:00")
    assert done.returncode == 0, done.stderr
    cells = (project.root / "reports" / "slurm" / "cells.sbatch").read_text()
    assert "#SBATCH --partition=gpu,gpu-long\n" in cells and "#SBATCH --time=1-12:00:00\n" in cells
    assert "-- --restart " in cells  # a requeued task starts its run directory clean


def test_cross_read_runs_no_interpreter_the_run_directory_names(tmp_path):
    """A run from elsewhere whose plan.json names an interpreter (a script that leaves a mark):
    cross-read says the version has no venv here, runs nothing, exits 0."""
    project = Project(tmp_path / "project")
    project.write("matrix.toml", MATRIX.format(suite_extra="", extra=""))
    project.write("suites/test_demo.py", SUITE)
    marker, interpreter = tmp_path / "artifact-code-ran", project.root / "artifact" / "python"
    project.write("artifact/python", f"#!/bin/sh\ntouch {marker}\n")
    interpreter.chmod(0o755)
    suites = {"cross_version": {"path": "x.py", "timeout": 60, "axes": []}}
    plan = _plan(environment={"python": str(interpreter)}, suites=suites, cell_axes=[CELL_AXES])
    project.write("reports/r/torch-2.13.0/plan.json", plan)
    done = project.torchmatrix("cross-read", "reports/r")
    assert done.returncode == 0 and not marker.exists(), done.stderr
    assert "torch 2.13.0's reads of the other versions' checkpoints are not checked: no gpu_matrix venv" in done.stderr


def test_report_replaces_symlinks_planted_at_its_reports(tmp_path):
    """summary.md, summary.html, results.json and junit.xml planted as links to a file outside (a
    stand-in for ~/.bashrc): each becomes a file of its own, the target stays as it was."""
    project = Project(tmp_path / "project")
    project.write("matrix.toml", MATRIX.format(suite_extra="", extra=""))
    project.write("suites/test_demo.py", SUITE)
    project.write(
        "reports/r/torch-2.13.0/plan.json", _plan(cell_axes=[CELL_AXES], finished=True).replace("SHA", _digest(project))
    )
    bashrc = tmp_path / "bashrc"
    bashrc.write_text("precious\n")
    names = ("summary.md", "summary.html", "results.json", "junit.xml")
    for name in names:
        (project.root / "reports" / "r" / name).symlink_to(bashrc)
    done = project.torchmatrix("report", "reports/r", "--config", "matrix.toml")
    assert done.returncode == 0, done.stderr
    assert bashrc.read_text() == "precious\n"
    assert all(not (project.root / "reports" / "r" / name).is_symlink() for name in names)


def test_list_json_into_a_reader_that_stops_early_is_quiet(tmp_path):
    """`list --json | head -3` on 10^4 cells (far more than a pipe holds): no BrokenPipeError, exit 0."""
    project = Project(tmp_path / "project")
    many = 'world_size = [1, 2]\nfsdp = ["none", "fsdp2"]\n' + "".join(
        f"a{i} = {json.dumps([f'v{i}{j}' for j in range(10)])}\n" for i in range(3)
    )
    project.write(
        "matrix.toml",
        MATRIX.format(suite_extra="", extra="").replace('world_size = [1, 2]\nfsdp = ["none", "fsdp2"]', many),
    )
    project.write("suites/test_demo.py", SUITE)
    lister = subprocess.Popen(
        [sys.executable, "-m", "torchmatrix", "list", "--json"],
        cwd=project.root,
        env=checkout_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    head = [lister.stdout.readline() for _ in range(3)]
    lister.stdout.close()
    stderr = lister.stderr.read()
    assert lister.wait(timeout=120) == 0, stderr
    assert head[0] == "{\n" and stderr == ""
