"""The root cause line: the innermost exception, an introducing line joined with its detail, and grouping."""

from __future__ import annotations

from torchmatrix.messages.root_cause import group_key, root_cause
from torchmatrix.reports.records import RunResults, TestRecord


def raised(function) -> BaseException:
    try:
        function()
    except BaseException as error:  # noqa: BLE001 - the test inspects whatever was raised
        return error
    raise AssertionError("nothing was raised")


def test_the_innermost_exception_of_a_chain_is_the_root_cause():
    def chained():
        try:
            {}["key"]
        except KeyError as cause:
            raise RuntimeError("wrapper") from cause

    assert root_cause(raised(chained)) == "KeyError: 'key'"


def test_a_headline_that_introduces_its_detail_takes_the_first_detail_line():
    def suite_assertion():
        raise AssertionError(
            "ws2-fsdp1, loader right after load vs at save:\n  rank 0: loader would yield batch 4\n  rank 1: …"
        )

    assert root_cause(raised(suite_assertion)) == (
        "AssertionError: ws2-fsdp1, loader right after load vs at save: rank 0: loader would yield batch 4"
    )


def test_volatile_parts_are_blanked_for_grouping():
    assert group_key("RuntimeError: Connection closed by peer [127.0.0.1]:41234") == group_key(
        "RuntimeError: Connection closed by peer [127.0.0.1]:5021"
    )


def test_the_same_failure_in_two_cells_is_one_root_cause():
    def record(cell):
        return TestRecord("2.7.1", cell, "resume", "t", "failed", 1.0, f"AssertionError: {cell}: loader late")

    results = RunResults("r", "", [], "", "", "2.7.1", None, [], {}, [record("ws1-a"), record("ws2-b")])
    [cause] = results.root_causes()
    assert cause.tests == 2 and cause.cells == ["ws1-a", "ws2-b"]


class FakeCheckpointException(BaseException):
    """What DCP raises: a message naming only the ranks, their exceptions in `failures`."""

    def __init__(self, failures):
        super().__init__(f"CheckpointException ranks:{failures.keys()}")
        self.failures = failures


def test_an_exception_collecting_ranks_failures_leads_with_the_first_ranks_cause():
    inner = AssertionError("metadata is None; global metadata read failed: too many values to unpack (expected 5)")
    error = FakeCheckpointException({0: (inner, None), 1: (inner, None)})
    assert root_cause(error) == (
        "FakeCheckpointException on ranks 0, 1: AssertionError: metadata is None; "
        "global metadata read failed: too many values to unpack (expected 5)"
    )


def test_quoted_absolute_paths_group_as_one_failure():
    one = (
        "AssertionError: read failed: No such file: '/r/run/torch-2.15.0/checkpoints/ws1-none/checkpoint/__0.metadata'"
    )
    other = (
        "AssertionError: read failed: No such file: '/r/run/torch-2.15.0/checkpoints/ws2-fsdp2/checkpoint/__0.metadata'"
    )
    assert group_key(one) == group_key(other) == "AssertionError: read failed: No such file: '…/__0.metadata'"
