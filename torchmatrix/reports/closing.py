"""The last lines a run or a report prints on the terminal: the totals, where to read the run, and
on failure each root cause with how far it reaches, so the terminal alone says what broke."""

from __future__ import annotations

from pathlib import Path

from torchmatrix.reports.records import ResultsError, RunResults
from torchmatrix.reports.run_reader import load_results
from torchmatrix.reports.untrusted_text import one_line
from torchmatrix.status import tally

CLOSING_ROOT_CAUSES = 5


def closing_lines(run: RunResults, run_dir: Path) -> str:
    """The run's last words: its totals, where to read it, and on failure each root cause with its reach."""
    head = f"torchmatrix: {tally(run.totals())}; read {run_dir / 'summary.md'} or {run_dir / 'summary.html'}"
    return "\n".join([head, *root_cause_lines(run)])


def root_cause_lines(run: RunResults) -> list[str]:
    """Each root cause of the run's failures with how many tests, cells and torch versions it reaches; none if all passed."""
    causes = run.root_causes()
    if not causes:
        return []
    lines = [f"torchmatrix: failures by root cause ({len(causes)}):"]
    lines += [
        f"  {cause.tests} tests in {len(cause.cells)} cells, torch {', '.join(cause.versions)}: {one_line(cause.line, 200)}"
        for cause in causes[:CLOSING_ROOT_CAUSES]
    ]
    if len(causes) > CLOSING_ROOT_CAUSES:
        lines.append(f"  … and {len(causes) - CLOSING_ROOT_CAUSES} more in the summary")
    return lines


def run_closing_lines(run_dir: Path, failed: bool) -> str:
    """A direct run's last words: on failure its root causes (as `report` lists them), then the
    command that writes its summaries, which a run alone does not."""
    lines = []
    if failed:
        try:
            lines = root_cause_lines(load_results(run_dir))
        except ResultsError as error:
            lines = [f"torchmatrix: cannot list the root causes: {error}"]
    lines.append(
        f"torchmatrix: write summary.md and summary.html with `python -m torchmatrix report {run_dir}` "
        f"(or `nox -s report -- {run_dir}`)"
    )
    return "\n".join(lines)
