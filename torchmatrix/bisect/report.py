"""bisect.json and bisect.md: what a bisect decided, each search's verdict line and every step."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.bisect.request import BisectRequest
from torchmatrix.bisect.steps import Steps, since
from torchmatrix.reports.machine_paths import without_machine_paths
from torchmatrix.reports.summary_templates import render_markdown
from torchmatrix.run.progress import format_seconds
from torchmatrix.status import count

REPORT_NAME = "bisect"


def _step_state(step: dict) -> str:
    """A step's `installed` column in bisect.md."""
    if not step["installed"]:
        return "no: " + step["reason"]
    if step.get("imports") is False:
        return "yes, but torch does not import: " + step["reason"]
    state = "reused" if step.get("reused") else "yes"
    return state + ("; interrupted" if step.get("interrupted") else "")


def _checkpoints(step: dict) -> str:
    """A direction step's checkpoints, as bisect.md's selection column adds them."""
    pairs = step.get("checkpoints")
    return f" ({'; '.join(f'written by {w}, read by {r}' for w, r in pairs)})" if pairs else ""


def write_report(
    out: Path, request: BisectRequest, searches: list, lines: list[str], steps: Steps, *, interrupted: bool
) -> None:
    data = {
        "out": str(out),
        "interrupted": interrupted,
        "from_run": str(request.from_run) if request.from_run else None,
        "seconds": since(steps.started),
        "steps": steps.log,
        "regressions": [
            {
                "suite": regression.suite,
                "test": regression.test,
                "cell": regression.cell,
                "cells": failure.cells,
                "direction": regression.direction,
                "good": regression.good,
                "bad": regression.bad,
                "candidates": search.candidates,
                "first_bad": None if search.stopped or search.next_version() else search.first_bad,
                "last_good": search.last_good,
                "stopped_at": search.stopped,
                "untested_between": search.untested_between,
                "tried": {v: {"outcome": o.value, "detail": d} for v, (o, d) in search.tried.items()},
                "verdict": line,
            }
            for failure, line in zip(searches, lines)
            for regression, search in [(failure.regressions[0], failure.bisection)]
        ],
    }
    file_writes.write_text(out / f"{REPORT_NAME}.json", json.dumps(data, indent=2) + "\n")
    headline = (
        f"{count(steps.count, 'step')} in {format_seconds(data['seconds'])}"
        + (f", regressions of run {request.from_run.name}" if request.from_run else "")
        + ("; interrupted: what was decided before the signal" if interrupted else "")
    )
    rows = [
        {
            "version": step["version"],
            "installed": _step_state(step),
            "selection": f"`{shlex.join(step['selection'])}`{_checkpoints(step)}",
            "seconds": f"{step['seconds']:.0f}",
        }
        for step in steps.log
    ]
    markdown = render_markdown("bisect.md", headline=headline, lines=lines, steps=rows)
    text = without_machine_paths(markdown, out, request.matrix.root)
    file_writes.write_text(out / f"{REPORT_NAME}.md", text)
