"""Compile time is reported apart from test time: the summary pages say, per torch version, how many
of its test seconds went to torch.compile (the tests' `compile_seconds` figures), and say nothing
where no test compiled."""

from __future__ import annotations

from torchmatrix.matrix.config import ReportSettings
from torchmatrix.reports import summary_html, summary_md
from torchmatrix.reports.records import RunResults, TestRecord, VersionInfo


def run(*records: TestRecord) -> RunResults:
    versions = [VersionInfo(torch) for torch in dict.fromkeys(record.torch for record in records)]
    cells = {record.cell: {"compile": record.cell} for record in records}
    return RunResults(
        "r", "now", ["host"], "matrix.toml", "0" * 64, "", ReportSettings(), versions, cells, list(records)
    )


def test_the_summary_says_how_much_of_each_versions_test_time_was_compiling():
    results = run(
        TestRecord("2.13.0", "inductor", "grad_ckpt", "test_a", "passed", 40.0, figures={"compile_seconds": 30.4}),
        TestRecord("2.13.0", "inductor", "grad_ckpt", "test_b", "passed", 2.0, figures={"compile_seconds": 0.6}),
        TestRecord("2.13.0", "none", "grad_ckpt", "test_a", "passed", 8.0),
        TestRecord("2.14.1", "none", "grad_ckpt", "test_a", "passed", 9.0),
    )
    page = summary_md.render(results, [])
    assert "Compile time: `2.13.0`: 31 s of 50 s of tests (the `compile_seconds` figure" in page
    assert "`2.14.1`: " not in page.split("Compile time:", 1)[1].split("\n", 1)[0], "2.14.1 compiled nothing"
    assert '<p id="compile-time">Compile time: <code>2.13.0</code>: 31 s of 50 s of tests' in summary_html.render(
        results, []
    )


def test_a_run_without_compiling_has_no_compile_line():
    results = run(TestRecord("2.13.0", "none", "grad_ckpt", "test_a", "passed", 8.0))
    assert "Compile time" not in summary_md.render(results, [])
    assert "compile-time" not in summary_html.render(results, [])
