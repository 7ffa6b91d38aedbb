"""A failure that only follows from another test's failure in the same cell names that test, so the
reports list it under that root cause instead of as a cause of its own."""

CONSEQUENCE_OF = "consequence_of"
"""The test property naming, comma-separated, the tests of the same suite and cell whose failure this
test's follows from (e.g. `test_state_restored_right_after_load[piece=scheduler]`)."""


def consequence_of(tests: list[str]) -> str:
    """The property value naming `tests`."""
    return ", ".join(tests)


def causes_named(value: object) -> tuple[str, ...]:
    """The tests a recorded CONSEQUENCE_OF value names (none where the value is not text)."""
    return tuple(test.strip() for test in value.split(",") if test.strip()) if isinstance(value, str) else ()
