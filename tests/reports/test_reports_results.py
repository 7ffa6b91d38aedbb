"""results.json: the golden file of the fixture run, the records behind it, and its round trip."""

from __future__ import annotations

import html
import json
import math
import re
import shutil

import pytest

from torchmatrix.env.devices import Environment
from torchmatrix.reports import junit, records, results_json
from torchmatrix.reports.records import VersionInfo
from torchmatrix.reports.report import load_run, write_report
from torchmatrix.reports.run_reader import load_results
from torchmatrix.status import Confirmation

from helpers.report_runs import BASELINE, CANDIDATE, check_golden
from helpers.results_documents import results_document


def test_results_json_matches_golden(run_dir):
    write_report(run_dir)
    check_golden(run_dir, "results.json")


def test_records_carry_status_duration_messages_figures_and_the_running_cell(run_dir):
    run = load_run(run_dir)
    assert (run.baseline, [v.torch for v in run.versions]) == (BASELINE, ["2.13.0", "2.14.1"])
    assert run.settings.drift_ratio == 10.0 and run.settings.slowdown_ratio == 1.5
    assert run.totals(CANDIDATE) == {"error": 2, "failed": 2, "CPU-simulation limit": 1, "passed": 35, "skipped": 4}
    by_key = {(r.torch, r.cell, r.suite, r.test): r for r in run.tests}
    regress = by_key[(CANDIDATE, "ws2-fsdp2", "alpha", "test_regress")]
    assert (regress.status, regress.duration, regress.message) == (
        "failed",
        0.5,
        "AssertionError: gradient of layer0.w differs",
    )
    assert "Traceback" in regress.text
    drift = by_key[(CANDIDATE, "ws2-fsdp2", "alpha", "test_drift[0.0]")]
    assert drift.figures == {
        "grad_max_abs/layer0.w": 1e-6,
        "grad_max_rel/layer0.w": 1e-7,
        "loss_max_abs": 0.0,
        "sharded_states": 3.0,
    }
    shared = by_key[(BASELINE, "ws2-fsdp2", "beta", "test_broken")]
    assert (shared.status, shared.ran_in, shared.run_cell) == ("error", "ws2-none", "ws2-none")
    assert run.cells["ws2-fsdp2"] == {"world_size": "2", "fsdp": "fsdp2"}
    assert run.version(CANDIDATE).environment.torch == "2.14.1+cpu"


def test_a_version_is_written_with_its_environment_flat_beside_it_and_read_back_whole():
    gpus = Environment("2.14.1+cu130", "bbb222", "13.0", 8, "NVIDIA H100")
    for info in (VersionInfo(CANDIDATE, gpus, planned_cells=("ws8",), pool_starts=1), VersionInfo(BASELINE)):
        written = info.to_json()
        assert list(written)[:6] == ["torch", *records.ENVIRONMENT_KEYS]
        assert VersionInfo.from_json(written) == info
    assert (written["build"], written["device"], written["gpu_count"]) == ("", "", 0), "nothing recorded stays empty"
    assert VersionInfo(CANDIDATE, gpus).to_json()["device"] == "cuda (8x NVIDIA H100, CUDA 13.0)"


def test_drift_figures_are_named_after_what_they_measure():
    assert records.is_drift_figure("grad_max_abs/layers.0.attn.wq")
    assert records.is_drift_figure("loss_max_abs") and records.is_drift_figure("logits_drift")
    assert not records.is_drift_figure("sharded_states")
    assert not records.is_drift_figure("reshard_tensors_compared/relative.weight")


def test_results_json_round_trips_and_reads_as_a_run(run_dir):
    write_report(run_dir)
    from_file = load_results(run_dir / "results.json")
    from_dir = load_run(run_dir)
    assert results_json.to_json(from_file) == results_json.to_json(from_dir)


def test_only_the_merged_junit_file_is_enough(run_dir, tmp_path):
    junit.merge_run(run_dir, "2.13.0")
    copy = tmp_path / "artifact"
    copy.mkdir()
    shutil.copy(run_dir / "junit.xml", copy / "junit.xml")
    run = load_results(copy)
    assert len(run.tests) == len(load_run(run_dir).tests)
    assert run.baseline == BASELINE, "without a matrix file the oldest version is the baseline"


def test_a_planned_cell_without_a_report_is_listed_missing(run_dir):
    (run_dir / f"torch-{CANDIDATE}" / "ws1-fsdp2.xml").unlink()
    run = load_run(run_dir)
    assert run.version(CANDIDATE).missing_cells == ("ws1-fsdp2",)
    assert run.version(BASELINE).missing_cells == ()


def test_non_finite_figures_are_strings_in_strict_json(run_dir):
    path = run_dir / f"torch-{CANDIDATE}" / "ws1-none.xml"
    path.write_text(path.read_text().replace('value="1e-09"', 'value="nan"', 1))
    write_report(run_dir)
    data = json.loads((run_dir / "results.json").read_text(), parse_constant=lambda c: pytest.fail(f"bare {c}"))
    figures = next(t for t in data["tests"] if t["torch"] == CANDIDATE and t["test"] == "test_drift[0.0]")["figures"]
    assert figures["grad_max_abs/layer0.w"] == "nan"
    loaded = load_results(run_dir / "results.json")
    record = next(r for r in loaded.tests if r.torch == CANDIDATE and r.test == "test_drift[0.0]")
    assert math.isnan(record.figures["grad_max_abs/layer0.w"])


def test_a_results_file_of_another_schema_is_refused(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"schema": "torchmatrix.results", "schema_version": 99}))
    with pytest.raises(records.ResultsError, match="regenerate"):
        load_results(path)


def test_a_corrupt_cell_file_is_named_in_a_one_line_error(run_dir):
    (run_dir / f"torch-{BASELINE}" / "ws1-none.xml").write_text("<testsuites><testsuite")
    with pytest.raises(records.ResultsError, match="ws1-none.xml is not readable JUnit XML"):
        load_results(run_dir)


def _note_in_text(text: str, confirmation: str, note: str) -> str:
    """A failure's text as runs before results.json version 5 wrote it: the note appended under a header."""
    return f"{text.rstrip()}\n\n---- re-run alone: {Confirmation(confirmation).description} ----\n{note}".lstrip()


def test_an_old_results_file_with_the_note_in_the_text_reads_as_typed_fields(run_dir, tmp_path):
    write_report(run_dir)
    current = json.loads((run_dir / "results.json").read_text())
    confirmed = [test for test in current["tests"] if test["confirmation"]]
    assert {test["confirmation_note"] for test in confirmed} >= {
        "passed",
        "failed: AssertionError: gradient of layer0.w differs",
    }
    assert not any("re-run alone" in test["text"] for test in current["tests"]), "the text is the test's own"
    old = json.loads(json.dumps(current))
    old["schema_version"] = 4
    for test in old["tests"]:
        note = test.pop("confirmation_note")
        if test["confirmation"]:
            test["text"] = _note_in_text(test["text"], test["confirmation"], note)
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert [(r.text, r.confirmation_note) for r in results_json.read_json(tmp_path / "old.json").tests] == [
        (test["text"].rstrip() if test["confirmation"] else test["text"], test["confirmation_note"])
        for test in current["tests"]
    ], "the text as the test wrote it (the old format kept no trailing whitespace), the note as the runner did"


@pytest.mark.parametrize(
    ("text", "confirmation", "read"),
    [
        (
            _note_in_text("E   assert 3 == 4", "not re-run", "more than 25 failures to re-run (--confirm-limit 25)"),
            "not re-run",
            ("E   assert 3 == 4", "past --confirm-limit 25"),
        ),
        (
            _note_in_text("E   boom", "not re-run", "the confirmation process reported nothing for this test"),
            "not re-run",
            ("E   boom", "the confirmation process reported nothing for this test"),
        ),
        (
            _note_in_text("E   boom", "not re-run", "past --confirm-limit 9 (a test printed this)"),
            "not re-run",
            ("E   boom", ""),
        ),
        (
            _note_in_text("printed ---- re-run alone: fails alone ----\nfake", "fails alone", "failed: boom"),
            "fails alone",
            ("printed ---- re-run alone: fails alone ----\nfake", "failed: boom"),
        ),
        (
            "E   boom\n---- re-run alone: fails alone ----\nby the test",
            "",
            ("E   boom\n---- re-run alone: fails alone ----\nby the test", ""),
        ),
    ],
    ids=[
        "past-the-limit",
        "reported-nothing",
        "a-test's-words-are-no-reason",
        "the-last-header-is-the-note",
        "unconfirmed-text-stays-whole",
    ],
)
def test_an_old_note_is_split_from_the_text_in_todays_words(text, confirmation, read):
    old = results_document(
        schema_version=4,
        run_id="old",
        cells=[{"id": "ws1", "axes": {"world_size": "1"}}],
        tests=[
            {"torch": "2.13.0", "cell": "ws1", "suite": "alpha", "test": "t", "status": "failed", "duration": 1.0,
             "text": text, "confirmation": confirmation}
        ],
    )  # fmt: skip
    (record,) = results_json.from_json(old).tests
    assert (record.text, record.confirmation_note) == read
    assert results_json.from_json({**old, "schema_version": 5}).tests[0].text == text, "a version 5 text is never split"


def test_an_old_junit_file_with_the_note_in_the_text_reads_as_typed_fields(run_dir):
    expected = load_results(run_dir).tests
    for path in sorted(run_dir.glob("torch-*/*.xml")):
        xml = path.read_text()
        notes = dict(
            re.findall(r'<property name="torchmatrix\.confirmation_note::alpha::([^"]+)" value="([^"]*)"', xml)
        )
        for test, note in notes.items():
            (confirmation,) = re.findall(
                rf'name="torchmatrix\.confirmation::alpha::{re.escape(test)}" value="([^"]*)"', xml
            )
            case = re.search(
                rf'<testcase name="{re.escape(test)}\[torch=[^"]*"[^>]*>\s*<(failure|error)[^>]*?(/>|>(.*?)</\1>)',
                xml,
                re.S,
            )
            body = case.group(3) or ""
            replaced = html.escape(_note_in_text(html.unescape(body), confirmation, html.unescape(note)), quote=False)
            xml = (
                xml[: case.start(3) if case.group(3) is not None else case.start(2)]
                + (replaced if case.group(3) is not None else f">{replaced}</{case.group(1)}>")
                + xml[case.end(3) if case.group(3) is not None else case.end(2) :]
            )
        xml = re.sub(r'\s*<property name="torchmatrix\.confirmation_note::[^"]*" value="[^"]*"\s*/>', "", xml)
        path.write_text(xml)
    assert "confirmation_note" not in "".join(p.read_text() for p in run_dir.glob("torch-*/*.xml"))
    assert [(r.text, r.confirmation_note) for r in load_results(run_dir).tests] == [
        (r.text.rstrip() if r.confirmation else r.text, r.confirmation_note) for r in expected
    ]
