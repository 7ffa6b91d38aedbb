"""The verdict of a torch bump: the lines both summaries open with, before any per-cell listing.

In the order a release engineer decides on them: regressions of the candidate (confirmed test
regressions and broken checkpoint directions), each checkpoint direction (attributed to the
candidate's writer or reader, its root cause whole), slowdowns, warnings that changed; then grown
drift. Each line is plain words plus, apart, the test-provided text it quotes, so each page renders
that text its own safe way.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchmatrix.reports.summary_data import count
from torchmatrix.reports.upgrade_diff import UpgradeDiff


@dataclass(frozen=True)
class VerdictLine:
    """One statement of the verdict: its topic, whether it argues against the bump, its words, and
    test-provided text it quotes whole (root causes), one entry each."""

    topic: str
    bad: bool
    says: str
    quoted: tuple[str, ...] = ()


def bump_verdict(diff: UpgradeDiff) -> list[VerdictLine]:
    """The verdict of one baseline → candidate pair, in reading order."""
    return [
        _regressions(diff),
        *(_direction(direction) for direction in diff.checkpoints),
        _slowdowns(diff),
        _warnings(diff),
        _drift(diff),
    ]


def _regressions(diff: UpgradeDiff) -> VerdictLine:
    tests = count(len(diff.regressions), "test")
    directions = ", ".join(d.name for d in diff.broken_directions)
    broken = (
        f" and {count(len(diff.broken_directions), 'checkpoint direction')} broken ({directions})"
        if diff.broken_directions
        else ""
    )
    unconfirmed = (
        f"; {count(len(diff.unconfirmed), 'status change')} unconfirmed (the failing side was not re-run alone, "
        "or passed alone), listed in the upgrade diff"
        if diff.unconfirmed
        else ""
    )
    says = (
        f"{count(diff.regression_count, 'regression')} of {diff.after}: {tests} that passed on {diff.before} "
        f"and {'fails' if len(diff.regressions) == 1 else 'fail'} alone on {diff.after}{broken}{unconfirmed}"
    )
    return VerdictLine("regressions", bool(diff.regression_count), says)


def _direction(direction) -> VerdictLine:
    cells = sum(map(len, direction.failed.values()))
    checked = len(direction.passed) + cells
    if direction.broken:
        says = (
            f"{direction.name} broken, caused by {direction.candidate}'s {direction.changed}: "
            f"{direction.verdict} in {cells} of {count(checked, 'checked cell')}; {direction.consequence}"
        )
        return VerdictLine(direction.name, True, says, tuple(direction.failed))
    not_checked = sum(map(len, direction.not_checked.values()))
    left = f" ({count(not_checked, 'cell')} not checked)" if not_checked and direction.passed else ""
    return VerdictLine(direction.name, False, f"{direction.name}: {direction.verdict}{left}")


def _slowdowns(diff: UpgradeDiff) -> VerdictLine:
    ratio = f"{diff.settings.slowdown_ratio:g}×"
    if not diff.slowdowns:
        return VerdictLine("slowdowns", False, f"no suite slower than {ratio}")
    suites = ", ".join(
        f"{s.suite} {s.after / s.before if s.before else float('inf'):.1f}× ({s.measure} time)" for s in diff.slowdowns
    )
    return VerdictLine("slowdowns", True, f"{count(len(diff.slowdowns), 'suite')} slower than {ratio}: {suites}")


def _warnings(diff: UpgradeDiff) -> VerdictLine:
    new_deprecations = sum(group.deprecation for group in diff.new_warnings)
    says = (
        f"warnings: {len(diff.new_warnings)} new ({count(new_deprecations, 'deprecation')}), "
        f"{len(diff.gone_warnings)} gone"
    )
    return VerdictLine("warnings", bool(new_deprecations), says)


def _drift(diff: UpgradeDiff) -> VerdictLine:
    ratio = f"{diff.settings.drift_ratio:g}×"
    if not diff.drift:
        return VerdictLine("drift", False, f"no drift figure grown more than {ratio}")
    return VerdictLine("drift", True, f"{count(len(diff.drift), 'drift figure')} grown more than {ratio}")
