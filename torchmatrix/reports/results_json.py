"""results.json: a run's records as one versioned JSON document (a CI artifact `compare` reads back).

A change that breaks readers bumps SCHEMA_VERSION; a file of a version this reader does not know,
or one whose values have the wrong kinds, is refused with one line that says how to regenerate it.
Version 3 added the status `CPU-simulation limit`; a version 2 file is a version 3 file without one.
Version 4 added each version's `load_average`, the tests' `cpu_seconds` figure and `warnings`, and the
upgrade diff's `checkpoints` (rollback, forward) and slowdown `measure`; a version 2 or 3 file reads as
one without them. Version 5 moved a confirmed failure's note out of its `text` into `confirmation_note`;
an older file's text is split back into the two.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.matrix.config import ReportSettings
from torchmatrix.reports.confirmation_notes import split_old_text
from torchmatrix.reports.records import ResultsError, RunResults, TestRecord, VersionInfo

SCHEMA = "torchmatrix.results"
SCHEMA_VERSION = 5
READABLE_VERSIONS = (2, 3, 4, SCHEMA_VERSION)
NOTE_IN_TEXT_VERSIONS = (2, 3, 4)
"""The versions whose tests[].text ends with the confirmation note."""
FILE_NAME = "results.json"
REGENERATE = "regenerate it with `python -m torchmatrix report RUN_DIR`"


def to_json(results: RunResults, upgrade: list[dict] | None = None) -> dict:
    """The results.json document of a run, with its upgrade diffs."""
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "run": {
            "id": results.run_id,
            "created": results.created,
            "hosts": results.hosts,
            "matrix": {"path": results.matrix_path, "sha256": results.matrix_sha256},
            "baseline": results.baseline,
            "thresholds": {
                "drift_ratio": results.settings.drift_ratio,
                "slowdown_ratio": results.settings.slowdown_ratio,
                "memory_ratio": results.settings.memory_ratio,
                "prerelease_blocks": results.settings.prerelease_blocks,
            },
            "totals": results.totals(),
        },
        "versions": [{**v.to_json(), "totals": results.totals(v.torch)} for v in results.versions],
        "cells": [{"id": cell, "axes": axes} for cell, axes in results.cells.items()],
        "tests": [record.to_json() for record in results.tests],
        "upgrade": upgrade or [],
    }


def from_json(data: dict) -> RunResults:
    """The run a results.json holds; anything malformed in it is a ResultsError naming the first problem."""
    if not isinstance(data, dict):
        raise ResultsError(f"not a JSON object; {REGENERATE}")
    try:
        results = _from_json(data)
        _check_types(results)
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        problem = f"missing key {error}" if isinstance(error, KeyError) else str(error)
        raise ResultsError(f"malformed ({problem}); {REGENERATE}") from None
    return results


def write_json(path: Path, results: RunResults, upgrade: list[dict]) -> Path:
    return file_writes.write_text(path, json.dumps(to_json(results, upgrade), indent=2, allow_nan=False) + "\n")


def read_json(path: Path) -> RunResults:
    """The run a results.json file holds; an unreadable or malformed file is a ResultsError naming it."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ResultsError(f"cannot read {path}: {error}") from None
    except RecursionError:
        raise ResultsError(f"cannot read {path}: nested too deeply for a results file; {REGENERATE}") from None
    try:
        return from_json(data)
    except ResultsError as error:
        raise ResultsError(f"{path}: {error}") from None


def _from_json(data: dict) -> RunResults:
    if data.get("schema") != SCHEMA or data.get("schema_version") not in READABLE_VERSIONS:
        raise ResultsError(
            f"not a {SCHEMA} {' or '.join(f'v{v}' for v in READABLE_VERSIONS)} file (schema {data.get('schema')!r} v{data.get('schema_version')!r}); "
            f"{REGENERATE}"
        )
    run = data["run"]
    return RunResults(
        run_id=run["id"],
        created=run["created"],
        hosts=run["hosts"],
        matrix_path=run["matrix"]["path"],
        matrix_sha256=run["matrix"]["sha256"],
        baseline=run["baseline"],
        settings=ReportSettings(**run["thresholds"]),
        versions=[VersionInfo.from_json({k: v for k, v in x.items() if k != "totals"}) for x in data["versions"]],
        cells={cell["id"]: cell["axes"] for cell in data["cells"]},
        tests=[_test_record(record, data["schema_version"]) for record in data["tests"]],
    )


def _test_record(data: dict, version: int) -> TestRecord:
    """One tests[] entry; in a file from before the note had its key, the note is taken out of the text."""
    record = TestRecord.from_json(data)
    if version not in NOTE_IN_TEXT_VERSIONS or not isinstance(record.text, str):
        return record
    text, note = split_old_text(record.text, record.confirmation)
    return replace(record, text=text, confirmation_note=note)


def _check_types(results: RunResults) -> None:
    """Raise TypeError or ValueError for a value of the wrong kind, before a report trips over it."""
    texts = {"torch", "cell", "suite", "test", "message", "text", "confirmation_note"}
    for record in results.tests:
        for name in texts:
            if not isinstance(getattr(record, name), str):
                raise TypeError(f"tests[].{name} {getattr(record, name)!r} is not text")
        if isinstance(record.duration, bool) or not isinstance(record.duration, (int, float)):
            raise TypeError(f"tests[].duration {record.duration!r} is not a number")
        if not _finite(record.duration):
            raise ValueError("tests[].duration is not a finite number of seconds")
        if record.ran_in is not None and not isinstance(record.ran_in, str):
            raise TypeError(f"tests[].ran_in {record.ran_in!r} is not text")
        for warning in record.warnings:
            if not isinstance(warning, dict) or not isinstance(warning.get("count"), int):
                raise TypeError(f"tests[].warnings entry {warning!r} is not a table with an integer count")
            if not all(isinstance(warning.get(key), str) for key in ("category", "module", "message")):
                raise TypeError(f"tests[].warnings entry {warning!r} lacks a text category, module or message")
    for version in results.versions:
        if not isinstance(version.torch, str):
            raise TypeError(f"versions[].torch {version.torch!r} is not text")
    if not isinstance(results.run_id, str) or not isinstance(results.baseline, str):
        raise TypeError("run.id and run.baseline must be text")
    if not isinstance(results.settings.prerelease_blocks, bool):
        raise TypeError(f"run.thresholds.prerelease_blocks {results.settings.prerelease_blocks!r} is not true or false")
    for name, ratio in vars(results.settings).items():
        if name == "prerelease_blocks":
            continue
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not (ratio > 0 and math.isfinite(ratio)):
            raise TypeError(f"run.thresholds.{name} {ratio!r} is not a positive number")


def _finite(number: int | float) -> bool:
    """Whether a JSON number is a finite float (a 400-digit integer is not one)."""
    try:
        return math.isfinite(float(number))
    except OverflowError:
        return False
