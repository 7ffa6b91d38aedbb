"""`torchmatrix report` and `torchmatrix compare`: every report file of a run, and the diff of two runs.

The baseline and the thresholds come from matrix.toml: the file given with --config, else the
one the run's plan.json names. A run copied away from its matrix file still reports, against
its oldest torch version with the default thresholds, and says so.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.matrix.config import load_matrix
from torchmatrix.messages.run_lock import running_holder
from torchmatrix.reports import junit, results_json, summary_html, summary_md
from torchmatrix.reports.checkpoint_directions import checkpoint_directions
from torchmatrix.reports.records import ResultsError, RunResults
from torchmatrix.reports.run_reader import load_results, recorded_report_settings
from torchmatrix.reports.upgrade_diff import (
    BROKEN_DIRECTION,
    FAIL_CAUSES,
    CompareError,
    FailCause,
    compare_runs,
    upgrade_diffs,
)

SUMMARY_MD = "summary.md"
SUMMARY_HTML = "summary.html"


def refuse_while_running(run_dir: Path) -> None:
    """Refuse a run directory a runner still writes to: its running cells would read as lost."""
    for version_dir in sorted(run_dir.glob("torch-*")):
        holder = running_holder(version_dir)
        if holder:
            raise ResultsError(
                f"{version_dir} is still being run ({holder}); write its report when that run has finished"
            )


def write_report(run_dir: Path, config: str | None = None) -> list[Path]:
    """Write junit.xml, results.json, summary.md and summary.html into the run directory (refused
    while a runner still writes to it)."""
    refuse_while_running(run_dir)
    run = load_run(run_dir, config)
    written = [junit.merge_run(run_dir, run.baseline)] if junit.cell_report_files(run_dir) else []
    diffs = upgrade_diffs(run)
    markdown = summary_md.render(run, diffs)
    written.append(results_json.write_json(run_dir / results_json.FILE_NAME, run, [d.to_json() for d in diffs]))
    written.append(file_writes.write_text(run_dir / SUMMARY_MD, markdown))
    written.append(file_writes.write_text(run_dir / SUMMARY_HTML, summary_html.render(run, diffs)))
    append_step_summary(markdown)
    return written


def compare_markdown(run_a: Path, run_b: Path) -> tuple[str, list[FailCause]]:
    """The upgrade diff of run B against run A as markdown (with run B's checkpoints across its own
    versions), and what of FAIL_CAUSES it holds (compare exits 1 on any): a regression, grown
    drift, a slowdown, a change never re-run alone, a broken checkpoint direction."""
    old, new = load_run(run_a), load_run(run_b)
    diffs = compare_runs(old, new)
    if not any(diff.compared for diff in diffs):
        raise CompareError(
            f"run {old.run_id} and run {new.run_id} share no test ({len(old.tests)} and {len(new.tests)} results, "
            "none of the same suite, test and cell): compare two runs of the same matrix and cells"
        )
    directions = [checkpoint_directions(new, new.baseline, v.torch) for v in new.versions if v.torch != new.baseline]
    broken = [BROKEN_DIRECTION] if any(direction.broken for pair in directions for direction in pair) else []
    found = {cause for diff in diffs for cause in diff.fail_causes}.union(broken)
    causes = [cause for cause in FAIL_CAUSES if cause in found]
    markdown = summary_md.compare(old.run_id, new.run_id, diffs, directions, causes)
    return markdown, causes


def load_run(path: Path, config: str | None = None) -> RunResults:
    """A run directory (or results.json) with the baseline and thresholds of `config`, else those its
    plan.json files recorded; a run from before they were recorded gets its oldest version and the defaults."""
    if config:
        matrix = load_matrix(config)
        return load_results(path, matrix.baseline, matrix.report)
    recorded = recorded_report_settings(path) if path.is_dir() else None
    if recorded is not None:
        return load_results(path, *recorded)
    run = load_results(path)
    if path.is_dir() and not (path / results_json.FILE_NAME).is_file():
        print(
            f"torchmatrix: {path} records no baseline or thresholds (a run of an older torchmatrix): baseline is its "
            "oldest torch version, thresholds are the defaults; pass --config FILE to choose",
            file=sys.stderr,
        )
    return run


def append_step_summary(markdown: str) -> None:
    """On GitHub Actions, add the markdown to the job's summary page."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if target:
        with file_writes.open_stream(Path(target), "a", encoding="utf-8") as summary:
            summary.write(markdown + "\n")
