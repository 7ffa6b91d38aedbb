"""The verdict of a torch bump: the lines both summaries open with, before any per-cell listing.

In the order a release engineer decides on them: regressions of the candidate (confirmed test
regressions and broken checkpoint directions), each checkpoint direction (attributed to the
candidate's writer or reader, its root cause whole), slowdowns, warnings that changed; then grown
drift, and builds of different kinds (CPU against CUDA) with what that can explain. Each line is
plain words plus, apart, the test-provided text it quotes, so each page renders that text its own
safe way.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchmatrix.reports.checkpoint_directions import Direction
from torchmatrix.reports.upgrade_diff import UpgradeDiff
from torchmatrix.reports.warning_changes import COUNT_FACTOR
from torchmatrix.status import count

BAD, WARN, GOOD = "bad", "warn", "good"
MAX_WARNINGS_QUOTED = 3


@dataclass(frozen=True)
class VerdictLine:
    """One statement of the verdict: its topic, its level (bad: argues against the bump; warn: read
    it before bumping; good), its words, and test-provided text it quotes whole (root causes,
    warning messages), one entry each."""

    topic: str
    level: str
    says: str
    quoted: tuple[str, ...] = ()


def bump_verdict(diff: UpgradeDiff) -> list[VerdictLine]:
    """The verdict of one baseline → candidate pair, in reading order."""
    return [
        _regressions(diff),
        *(_direction(direction) for direction in diff.checkpoints),
        _slowdowns(diff),
        _memory(diff),
        _warnings(diff),
        _drift(diff),
        *([VerdictLine("builds", WARN, diff.builds.note)] if diff.builds else []),
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
    return VerdictLine("regressions", BAD if diff.regression_count else GOOD, says)


def _direction(direction: Direction) -> VerdictLine:
    cells = sum(map(len, direction.failed.values()))
    checked = len(direction.passed) + cells
    if direction.broken:
        says = (
            f"{direction.name} broken, caused by {direction.candidate}'s {direction.changed}: "
            f"{direction.verdict} in {cells} of {count(checked, 'checked cell')}; {direction.consequence}"
        )
        return VerdictLine(direction.name, BAD, says, tuple(direction.failed))
    not_checked = sum(map(len, direction.not_checked.values()))
    left = f" ({count(not_checked, 'cell')} not checked)" if not_checked and direction.passed else ""
    return VerdictLine(direction.name, WARN if not_checked else GOOD, f"{direction.name}: {direction.verdict}{left}")


def _slowdowns(diff: UpgradeDiff) -> VerdictLine:
    ratio = f"{diff.settings.slowdown_ratio:g}×"
    if not diff.slowdowns:
        return VerdictLine("slowdowns", GOOD, f"no suite slower than {ratio}")
    suites = ", ".join(
        f"{s.suite} {s.after / s.before if s.before else float('inf'):.1f}× ({s.measure} time)" for s in diff.slowdowns
    )
    return VerdictLine("slowdowns", BAD, f"{count(len(diff.slowdowns), 'suite')} slower than {ratio}: {suites}")


def _memory(diff: UpgradeDiff) -> VerdictLine:
    ratio = f"{diff.settings.memory_ratio:g}×"
    if not diff.memory:
        return VerdictLine("memory", GOOD, f"no memory grown past {ratio}")
    grown = ", ".join(
        f"{m.suite} {m.what} {m.growth}" + (f" in {m.cell}" if m.cell else f" over {m.tests} tests")
        for m in diff.memory[:3]
    )
    more = f" and {len(diff.memory) - 3} more" if len(diff.memory) > 3 else ""
    return VerdictLine("memory", BAD, f"{count(len(diff.memory), 'figure')} grown past {ratio}: {grown}{more}")


def _warnings(diff: UpgradeDiff) -> VerdictLine:
    """New, gone, and raised more or less often per test; the changed ones quoted, deprecations first."""
    new_deprecations = sum(group.deprecation for group in diff.new_warnings)
    changed = diff.changed_warnings
    says = (
        f"warnings: {len(diff.new_warnings)} new ({count(new_deprecations, 'deprecation')}), "
        f"{len(diff.gone_warnings)} gone, {len(changed)} raised more or less often than {COUNT_FACTOR:g}× per test"
        + (
            f" (the first {MAX_WARNINGS_QUOTED} here, all in the upgrade diff)"
            if len(changed) > MAX_WARNINGS_QUOTED
            else ""
        )
    )
    quoted = tuple(
        f"{c.after.category} {c.after.message}: {c.before.count:,} → {c.after.count:,} raises "
        f"({c.per_test_before:,.2f} → {c.per_test_after:,.2f} per test, {c.ratio:.2f}×)"
        for c in changed[:MAX_WARNINGS_QUOTED]
    )
    return VerdictLine("warnings", WARN if new_deprecations or changed else GOOD, says, quoted)


def _drift(diff: UpgradeDiff) -> VerdictLine:
    ratio = f"{diff.settings.drift_ratio:g}×"
    if not diff.drift:
        return VerdictLine("drift", GOOD, f"no drift figure grown more than {ratio}")
    return VerdictLine("drift", BAD, f"{count(len(diff.drift), 'drift figure')} grown more than {ratio}")
