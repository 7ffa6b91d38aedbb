"""A failure's root cause: the `ExcType: message` line of its innermost exception.

A rank's traceback can run to hundreds of lines, and the outer exception (a RankFailure, a
wrapper's RuntimeError) rarely says what broke. The innermost exception of the chain, the one
Python prints first, usually does; reports lead with it and group failures by it.
"""

from __future__ import annotations

import re
import traceback

MAX_LENGTH = 500
VOLATILE = (
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\]?:\d+"), "HOST:PORT"),
    (re.compile(r"\b0x[0-9a-fA-F]{6,}\b"), "0x…"),
    (re.compile(r"(/tmp|/var/tmp)/[^\s'\"]+"), r"\1/…"),
    (re.compile(r"\bpid \d+"), "pid N"),
    (re.compile(r"'/[^'\s]*/([^'/\s]+)'"), r"'…/\1'"),  # a quoted absolute path: each cell has its own
)


def innermost(error: BaseException) -> BaseException:
    """The exception at the bottom of `error`'s chain (`raise ... from` and implicit context)."""
    seen = {id(error)}
    while True:
        below = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
        if below is None or id(below) in seen:
            return error
        seen.add(id(below))
        error = below


def exception_line(error: BaseException) -> str:
    """`ExcType: first line of the message`, as Python names the type in a traceback; a first line
    that only introduces what follows (it ends with a colon) takes the next line with it."""
    text = "".join(traceback.format_exception_only(type(error), error)).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()] or [type(error).__name__]
    line = f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return line if len(line) <= MAX_LENGTH else line[: MAX_LENGTH - 1] + "…"


def root_cause(error: BaseException) -> str:
    """The root cause line of `error`: its own, if it carries one (a RankFailure), else its innermost exception's."""
    own = getattr(error, "root_cause", None)
    return own if own else exception_line_within(innermost(error))


def exception_line_within(error: BaseException) -> str:
    """exception_line, except for an exception that collects other ranks' exceptions (DCP's
    CheckpointException: `failures`, rank -> (exception, traceback)), whose own message names
    only the ranks: there the first rank's root cause, after the ranks."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        inner = first[0] if isinstance(first, tuple) and first else first
        if isinstance(inner, BaseException):
            ranks = ", ".join(map(str, failures))
            line = f"{type(error).__name__} on ranks {ranks}: {exception_line_within(innermost(inner))}"
            return line if len(line) <= MAX_LENGTH else line[: MAX_LENGTH - 1] + "…"
    return exception_line(error)


def group_key(line: str) -> str:
    """The root cause with what differs between runs of the same failure (ports, addresses,
    temporary paths, pids) blanked, so the same failure in many cells groups as one."""
    for pattern, replacement in VOLATILE:
        line = pattern.sub(replacement, line)
    return line
