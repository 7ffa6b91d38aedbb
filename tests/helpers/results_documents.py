"""Hand-written results.json documents, for the tests that feed the readers an old schema or crafted input."""

from __future__ import annotations


def results_document(*, schema_version: int, run_id: str = "a", versions=(), cells=(), tests=()) -> dict:
    """A results.json of `schema_version` holding these versions, cells and tests, under a run header
    with baseline 2.13.0 and the default thresholds."""
    return {
        "schema": "torchmatrix.results",
        "schema_version": schema_version,
        "run": {
            "id": run_id,
            "created": "",
            "hosts": [],
            "matrix": {"path": "", "sha256": ""},
            "baseline": "2.13.0",
            "thresholds": {"drift_ratio": 10.0, "slowdown_ratio": 1.5},
        },
        "versions": list(versions),
        "cells": list(cells),
        "tests": list(tests),
    }
