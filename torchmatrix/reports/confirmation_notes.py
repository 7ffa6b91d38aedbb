"""A failure's confirmation note as the reports read it: why a failure has no verdict from a re-run
alone, and the note of a report written before the note was a field of its own.

- The runner (`torchmatrix.run.confirmation`) writes the note in these words; the reports count
  the failures that were not re-run by it.
- Reports written before (results.json up to version 4, JUnit without the note property) carried
  the note at the end of the failure's text; `split_old_text` takes it back out, for them only.
"""

from __future__ import annotations

import re

from torchmatrix.status import Confirmation

REPORTED_NOTHING = "the confirmation process reported nothing for this test"
INTERRUPTED = "the run was stopped (Ctrl-C or SIGTERM) before this test's re-run alone reported"
NOT_RECORDED = "confirmation switched off by --confirm-limit 0, or a suite that never collected"
NO_REASON = "no reason recorded"
OLD_PAST_LIMIT = re.compile(r"^more than (\d+) failures to re-run")


def past_limit(limit: int) -> str:
    """The note of a failure left without a re-run because more than `limit` failed."""
    return f"past --confirm-limit {limit}"


def why_not_rerun(confirmation: Confirmation | None, note: str) -> str:
    """Why a failure has no verdict from a re-run alone: the runner's note, or, with none, that no
    re-run was attempted."""
    if confirmation != Confirmation.NOT_RERUN:
        return NOT_RECORDED
    return note or NO_REASON


def split_old_text(text: str, confirmation: Confirmation | None) -> tuple[str, str]:
    """(the failure's own text, its note) from a report that appended the note to the text under a
    `---- re-run alone: <verdict> ----` line; a text without that line is returned whole."""
    if confirmation is None:
        return text, ""
    own, header, note = text.rpartition(f"---- re-run alone: {confirmation.description} ----")
    if not header:
        return text, ""
    note = note.strip()
    if confirmation == Confirmation.NOT_RERUN:
        note = _old_reason(note.partition("\n")[0])
    return own.rstrip(), note


def _old_reason(line: str) -> str:
    """An old not-re-run note in today's words; anything else (a test's own text) is no reason."""
    old_limit = OLD_PAST_LIMIT.match(line)
    if old_limit:
        return past_limit(int(old_limit.group(1)))
    return REPORTED_NOTHING if line == REPORTED_NOTHING else ""
