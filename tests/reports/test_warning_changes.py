"""Warnings raised more or less often: the count per test compared against COUNT_FACTOR, both counts
listed, deprecations first, and what the summaries make of it. The counts are issue 39's, from a
2.13.0 → 2.15.0 run: ShardedTensor's FutureWarning 13,542 → 21,906 (1.62×), "Multiple backends"
10,668 → 12,096 (1.13×)."""

from __future__ import annotations

from torchmatrix.matrix.config import ReportSettings
from torchmatrix.reports import summary_md
from torchmatrix.reports.records import RunResults, TestRecord, VersionInfo
from torchmatrix.reports.upgrade_diff import upgrade_diffs
from torchmatrix.reports.warning_changes import COUNT_FACTOR, count_changes

SHARDED = {"category": "FutureWarning", "module": "torch.distributed._shard", "message": "ShardedTensor is deprecated"}
BACKENDS = {"category": "UserWarning", "module": "torch.distributed", "message": "Multiple backends are registered"}
NOISY = {"category": "UserWarning", "module": "suite", "message": "logged once per step"}


def raised_in(version: str, n: int, *warnings: tuple[dict, int]) -> list[TestRecord]:
    """`n` tests of one version; each warning's total spread over them (the rest on the first test)."""
    records = []
    for i in range(n):
        raised = tuple(
            {**warning, "count": total // n + (total % n if i == 0 else 0)} for warning, total in warnings if total
        )
        records.append(TestRecord(version, "ws1", "s", f"t{i}", "passed", 1.0, warnings=raised))
    return records


def test_a_count_per_test_beyond_the_factor_is_listed_with_both_counts():
    before = raised_in("2.13.0", 10, (SHARDED, 13_542), (BACKENDS, 10_668))
    after = raised_in("2.15.0", 10, (SHARDED, 21_906), (BACKENDS, 12_096))
    (change,) = count_changes(before, after)
    assert (change.after.message, change.before.count, change.after.count) == (SHARDED["message"], 13_542, 21_906)
    assert change.ratio > COUNT_FACTOR > 12_096 / 10_668


def test_counts_are_per_test_so_a_smaller_candidate_run_is_not_quieter():
    before = raised_in("2.13.0", 20, (SHARDED, 2_000))
    after = raised_in("2.15.0", 10, (SHARDED, 1_000))
    assert count_changes(before, after) == []
    fell = count_changes(before, raised_in("2.15.0", 10, (SHARDED, 100)))
    assert [round(c.ratio, 2) for c in fell] == [0.1], "a count that fell is a change too"


def test_deprecations_come_first_even_when_another_warning_changed_more():
    before = raised_in("2.13.0", 4, (SHARDED, 100), (NOISY, 10))
    after = raised_in("2.15.0", 4, (SHARDED, 200), (NOISY, 90))
    assert [c.after.category for c in count_changes(before, after)] == ["FutureWarning", "UserWarning"]


def test_both_summaries_list_the_change_and_the_verdict_quotes_it():
    records = raised_in("2.13.0", 10, (SHARDED, 13_542)) + raised_in("2.15.0", 10, (SHARDED, 21_906))
    run = RunResults(
        "run", "", [], "", "", "2.13.0", ReportSettings(), [VersionInfo("2.13.0"), VersionInfo("2.15.0")], {}, records
    )
    markdown = summary_md.render(run, upgrade_diffs(run))
    verdict = markdown.split("### Verdict", 1)[1].split("\n\n")[1]
    assert "⚠️ warnings: 0 new (0 deprecations), 0 gone, 1 raised more or less often than 1.5× per test" in verdict
    assert "`FutureWarning ShardedTensor is deprecated: 13,542 → 21,906 raises (1,354.20 → 2,190.60 per test" in verdict
    row = "| `FutureWarning` | `torch.distributed._shard` | `ShardedTensor is deprecated` | 13,542 (1,354.20 per test)"
    assert row in markdown
