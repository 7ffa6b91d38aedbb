"""Builds of different kinds on the two sides of an upgrade diff: named, and what it can explain said,
in the diff, the verdict and results.json; builds of one kind say nothing."""

from __future__ import annotations

import pytest

from torchmatrix.env.devices import Environment
from torchmatrix.matrix.config import ReportSettings
from torchmatrix.reports import summary_html, summary_md
from torchmatrix.reports.build_kinds import build_kind, build_mismatch
from torchmatrix.reports.records import RunResults, TestRecord, VersionInfo
from torchmatrix.reports.upgrade_diff import upgrade_diffs

CPU_RANKS = "cpu (ranks simulated as processes, gloo)"
GPUS = "cuda (8x NVIDIA H100 80GB HBM3, CUDA 12.6)"


@pytest.mark.parametrize(
    ("build", "cuda_version", "kind"),
    [
        ("2.13.0+cpu", "", "CPU"),
        ("2.14.1+cu130", "13.0", "CUDA 13.0"),
        ("2.15.0+cu128", "", "CUDA 12.8"),
        ("2.15.0+rocm6.2", "", "ROCm 6.2"),
        ("2.15.0", "12.8", "CUDA 12.8"),  # PyPI's default wheel: no local tag
        ("2.15.0", "", "CPU"),
        ("", "", ""),  # not recorded: unknown, never a mismatch
    ],
)
def test_the_kind_of_a_build(build, cuda_version, kind):
    assert build_kind(VersionInfo("v", Environment.recorded(build, cuda_version=cuda_version))) == kind


def run(before: VersionInfo, after: VersionInfo) -> RunResults:
    records = [TestRecord(v.torch, "ws1", "s", "t", "passed", 1.0) for v in (before, after)]
    return RunResults("run", "", [], "", "", before.torch, ReportSettings(), [before, after], {"ws1": {}}, records)


def test_a_cpu_build_against_a_cuda_build_on_cpu_ranks_says_what_it_can_explain():
    before = VersionInfo("2.13.0", Environment.recorded("2.13.0+cpu", device=CPU_RANKS))
    after = VersionInfo("2.14.1", Environment.recorded("2.14.1+cu130", cuda_version="13.0", device=CPU_RANKS))
    results = run(before, after)
    (diff,) = upgrade_diffs(results)
    assert diff.to_json()["builds"] == {"before": "CPU", "after": "CUDA 13.0", "on_gpus": False}
    note = diff.builds.note
    assert note.startswith("Different builds: the baseline is a CPU build, the candidate a CUDA 13.0 build.")
    assert "can explain time" in note and "not a failure, drift, or a checkpoint that does not load" in note
    markdown = summary_md.render(results, [diff])
    assert f"- ⚠️ {note}" in markdown.split("| torch |")[0], "in the verdict, before the totals"
    assert f"⚠️ {note}" in markdown.split("### Upgrade diff")[1]
    assert '<p class="warn builds">Different builds:' in summary_html.render(results, [diff])


def test_two_cuda_versions_on_gpus_can_explain_drift_but_not_a_failed_load():
    before = VersionInfo("2.13.0", Environment.recorded("2.13.0+cu126", device=GPUS))
    after = VersionInfo("2.14.1", Environment.recorded("2.14.1+cu130", device=GPUS))
    note = build_mismatch(before, after).note
    assert "can explain grown drift" in note and "cannot explain a failed checkpoint load" in note


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (("2.13.0+cpu", ""), ("2.14.1+cpu", "")),
        (("2.13.0+cu130", ""), ("2.14.1", "13.0")),
        (("", ""), ("2.14.1+cu130", "")),
    ],
)
def test_builds_of_one_kind_or_unknown_say_nothing(before, after):
    versions = [
        VersionInfo(v, Environment.recorded(build, cuda_version=cuda))
        for v, (build, cuda) in zip(("2.13.0", "2.14.1"), (before, after))
    ]
    (diff,) = upgrade_diffs(run(*versions))
    assert diff.builds is None
    assert "Different builds" not in summary_md.render(run(*versions), [diff])


def grown_memory(before: VersionInfo, after: VersionInfo):
    """The upgrade diff's grown memory, both sides' four tests holding 400 MiB resident and a training
    step of 1 MiB activations, the candidate's 600 MiB and 4 MiB."""
    records = [
        TestRecord(v.torch, "ws1", "s", f"t{i}", "passed", 1.0, figures=figures)
        for v, figures in (
            (before, {"peak_rss_bytes": 400 * 2**20, "step_peak_bytes/activations": 2**20}),
            (after, {"peak_rss_bytes": 600 * 2**20, "step_peak_bytes/activations": 4 * 2**20}),
        )
        for i in range(4)
    ]
    results = RunResults("run", "", [], "", "", before.torch, ReportSettings(), [before, after], {"ws1": {}}, records)
    (diff,) = upgrade_diffs(results)
    return {growth.figure for growth in diff.memory}, diff


def test_a_cuda_build_holding_more_resident_than_a_cpu_build_is_no_grown_memory_but_its_steps_still_compare():
    cpu = VersionInfo("2.13.0", Environment.recorded("2.13.0+cpu", device=CPU_RANKS))
    cuda = VersionInfo("2.14.1", Environment.recorded("2.14.1+cu130", cuda_version="13.0", device=CPU_RANKS))
    grown, diff = grown_memory(cpu, cuda)
    assert grown == {"step_peak_bytes/activations"}, "the resident peak compared across builds"
    assert "resident peaks (`peak_rss_bytes`) are not compared" in diff.builds.note
    assert "the training step's bytes by kind of tensor still are" in diff.builds.note
    also_cpu = VersionInfo("2.14.1", Environment.recorded("2.14.1+cpu", device=CPU_RANKS))
    grown, diff = grown_memory(cpu, also_cpu)
    assert diff.builds is None
    assert grown == {"step_peak_bytes/activations", "peak_rss_bytes"}, "builds of one kind compare their peaks"
