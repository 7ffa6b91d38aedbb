"""The last lines a run or a report prints on the terminal: the totals, where to read the run, and
on failure each root cause with how far it reaches, so the terminal alone says what broke; then,
apart, each CPU-simulation limit the run hit, with the hint that works around it."""

from __future__ import annotations

import shlex
from pathlib import Path

from torchmatrix.reports.checkpoint_directions import relative_to_run
from torchmatrix.reports.records import ResultsError, RootCause, RunResults
from torchmatrix.reports.run_reader import load_results
from torchmatrix.reports.summary_data import read_label
from torchmatrix.reports.untrusted_text import one_line
from torchmatrix.status import count, tally

CLOSING_ROOT_CAUSES = 5
ROOT_CAUSE_CHARS = 200
LIMIT_CHARS = 400  # the root cause and then the hint


def closing_lines(run: RunResults, run_dir: Path) -> str:
    """The run's last words: its totals, where to read it, each root cause of its failures and each
    CPU-simulation limit it hit, with their reach."""
    head = f"torchmatrix: {tally(run.totals())}; read {run_dir / 'summary.md'} or {run_dir / 'summary.html'}"
    return "\n".join([head, *root_cause_lines(run), *simulation_limit_lines(run)])


def root_cause_lines(run: RunResults) -> list[str]:
    """Each root cause of the run's failures with how many tests, cells and torch versions it reaches; none if all passed."""
    causes = run.root_causes()
    if not causes:
        return []
    return [f"torchmatrix: failures by root cause ({len(causes)}):", *_reach(causes, ROOT_CAUSE_CHARS, run)]


def simulation_limit_lines(run: RunResults) -> list[str]:
    """Each CPU-simulation limit the run hit, with its hint and reach: not failures, so they are
    listed apart; none on a GPU run."""
    limits = run.simulation_limits()
    if not limits:
        return []
    return [
        f"torchmatrix: CPU-simulation limits, not failures of the stack ({len(limits)}):",
        *_reach(limits, LIMIT_CHARS, run),
    ]


def _reach(causes: list[RootCause], chars: int, run: RunResults) -> list[str]:
    lines = [
        f"  {count(cause.tests, 'test')}{_following(cause)} in {count(len(cause.cells), 'cell')}, {_where(cause, run.baseline)}: "
        + one_line(relative_to_run(cause.line, run.run_id), chars)
        for cause in causes[:CLOSING_ROOT_CAUSES]
    ]
    if len(causes) > CLOSING_ROOT_CAUSES:
        lines.append(f"  … and {len(causes) - CLOSING_ROOT_CAUSES} more in the summary")
    return lines


def _following(cause: RootCause) -> str:
    """` (2 following from it)`: the consequences counted in a cause's tests, where it has some."""
    return f" ({cause.consequence_tests} following from it)" if cause.consequences else ""


def _where(cause: RootCause, baseline: str) -> str:
    """`torch 2.13.0, 2.14.1`, or where reads of another version's checkpoints failed, their directions."""
    if not any(record.reads_writer for record, _ in cause.failures):
        return f"torch {', '.join(cause.versions)}"
    return ", ".join(dict.fromkeys(read_label(r, baseline) or f"torch {r.torch}" for r, _ in cause.failures))


def run_closing_lines(run_dir: Path, failed: bool, report_follows: bool = False, report_hint: bool = True) -> str:
    """A direct run's last words: its root causes on failure and the CPU-simulation limits it hit
    (as `report` lists them), then the command that writes its summaries, which a run alone does
    not; under nox, whose report session follows, that it will; a bisect step (`report_hint` false)
    names neither, since the bisect writes its own report."""
    try:
        run = load_results(run_dir)
        lines = [*root_cause_lines(run), *simulation_limit_lines(run)]
    except ResultsError as error:
        lines = [f"torchmatrix: cannot list the root causes: {error}"] if failed else []
    if report_hint and report_follows:
        lines.append(f"torchmatrix: nox's report session writes the summaries of {run_dir} once every version has run")
    elif report_hint:
        quoted = shlex.quote(str(run_dir))
        lines.append(
            f"torchmatrix: write summary.md and summary.html with `python -m torchmatrix report {quoted}` "
            f"(or `nox -s report -- {quoted}`)"
        )
    return "\n".join(lines)
