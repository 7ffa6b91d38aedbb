"""summary.md: the GitHub-flavoured markdown page a person pastes into the PR that bumps torch.

- The verdict of each bump first, then totals per torch version and per checkpoint direction, the
  grid of cells x versions (one mark per suite) and directions (one mark per cell), the failures
  with their first lines, then the upgrade diff (templates/summary.md, templates/upgrade_diff.md).
- Test-provided text only ever appears inside code spans or fenced blocks sized to the text
  (summary_templates escapes every value so), so no name or message can turn into markup or HTML.
"""

from __future__ import annotations

import math
import re

from torchmatrix.reports.bump_verdict import BAD, GOOD, WARN
from torchmatrix.reports.checkpoint_directions import Direction
from torchmatrix.reports.records import RunResults
from torchmatrix.reports.summary_data import (
    summarize,
)
from torchmatrix.reports.summary_grid import grid
from torchmatrix.reports.summary_templates import page_names, render_markdown
from torchmatrix.reports.upgrade_diff import FailCause, UpgradeDiff
from torchmatrix.status import NOT_RUN, Confirmation

MAX_ROOT_CAUSES = 30
MAX_FAILURES_PER_CAUSE = 12
ROOT_CAUSE_CHARS = 300
MAX_DIFF_ROWS = 30
FAILURE_TEXT_LINES = 40
RANK_TRACEBACK = re.compile(r"^-+ rank \d+ traceback -+$")
MAX_CELLS_NAMED = 12
MAX_TEXTS_PER_CAUSE = 3
VERDICT_MARKS = {BAD: "❌", WARN: "⚠️", GOOD: "✅"}


def render(results: RunResults, diffs: list[UpgradeDiff]) -> str:
    """The whole page."""
    return render_markdown(
        "summary.md",
        summary=summarize(results),
        diffs=diffs,
        grid=grid(results, [d for diff in diffs for d in diff.checkpoints]),
        **_names(),
    )


def compare(
    old_run: str, new_run: str, diffs: list[UpgradeDiff], directions: list[list[Direction]], causes: list[FailCause]
) -> str:
    """What `torchmatrix compare` prints: each diff of run `new_run` against `old_run`, then its
    checkpoint directions, then what it exits 1 on."""
    return render_markdown(
        "compare.md", old_run=old_run, new_run=new_run, diffs=diffs, directions=directions, causes=causes, **_names()
    )


def excerpt(text: str) -> str:
    """What a reader needs of a failure's text: the first failing rank's traceback when there is one
    (the pytest frames before it only say which test called ranks.run), else the text's end."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if RANK_TRACEBACK.match(line)), None)
    if start is not None:
        return "\n".join(lines[start : start + FAILURE_TEXT_LINES])
    return "\n".join(lines[-FAILURE_TEXT_LINES:])


def _names() -> dict[str, object]:
    """The limits, words and functions the markdown templates use."""
    return dict(
        MAX_ROOT_CAUSES=MAX_ROOT_CAUSES,
        MAX_FAILURES_PER_CAUSE=MAX_FAILURES_PER_CAUSE,
        ROOT_CAUSE_CHARS=ROOT_CAUSE_CHARS,
        MAX_DIFF_ROWS=MAX_DIFF_ROWS,
        MAX_CELLS_NAMED=MAX_CELLS_NAMED,
        MAX_TEXTS_PER_CAUSE=MAX_TEXTS_PER_CAUSE,
        VERDICT_MARKS=VERDICT_MARKS,
        INFINITY=math.inf,
        NOT_RUN=NOT_RUN,
        PASSED_ALONE=Confirmation.PASSED_ALONE,
        excerpt=excerpt,
        **page_names(),
    )
