"""The known-failure memo of a cell's store folder: what a test failed with is read back as written,
and a memo that cannot be read or written costs the memo, never the run."""

from __future__ import annotations

from torchmatrix.messages.compile_store import KNOWN_FAILURES
from torchmatrix.ranks.known_failure_memo import recalled_reason, record_failure, recorded_failure


def test_a_recorded_failure_is_read_back_per_test(tmp_path):
    folder = tmp_path / "ws4-inductor"
    assert recorded_failure(folder, "grad_ckpt::test_a") is None, "a folder that does not exist recalls nothing"
    record_failure(folder, "grad_ckpt::test_a", "AssertionError: saved a DeviceMesh")
    record_failure(folder, "peak_memory::test_b", "RuntimeError: b")
    recalled = recorded_failure(folder, "grad_ckpt::test_a")
    assert recalled.root_cause == "AssertionError: saved a DeviceMesh" and recalled.recorded.endswith("UTC")
    assert recorded_failure(folder, "peak_memory::test_b").root_cause == "RuntimeError: b", "each test keeps its own"
    assert recorded_failure(folder, "grad_ckpt::test_c") is None


def test_a_memo_that_cannot_be_read_or_written_recalls_nothing_and_raises_nothing(tmp_path):
    folder = tmp_path / "cell"
    folder.mkdir()
    for text in ("{not json", "[1, 2]", '{"grad_ckpt::test_a": "a string, not a record"}'):
        (folder / KNOWN_FAILURES).write_text(text)
        assert recorded_failure(folder, "grad_ckpt::test_a") is None, text
    blocked = tmp_path / "a file where the cell folder would be"
    blocked.write_text("")
    record_failure(blocked, "grad_ckpt::test_a", "AssertionError")
    assert recorded_failure(blocked, "grad_ckpt::test_a") is None


def test_a_recalled_reason_keeps_the_entrys_and_says_how_to_run_it_again():
    reason = recalled_reason("pytorch#1: compiled blocks at a second length")
    assert reason.startswith("pytorch#1: compiled blocks at a second length (not run again:")
    assert "--cold-compile runs it" in reason
    assert "UTC" not in reason, "the summary groups skips by their message: the date is the property's"
