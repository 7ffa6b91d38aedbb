"""Text that tests provide (names, messages, tracebacks) is untrusted: invisible characters are shown as escapes.

Control characters and bidirectional overrides can hide or reorder what a reader sees, so every
report format turns them into visible `\\xNN` / `\\uNNNN` escapes before its own escaping.
"""

from __future__ import annotations

import re

INVISIBLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


def visible(text: str) -> str:
    """`text` with control and bidi characters written as escapes; tabs, newlines and carriage returns kept."""
    return INVISIBLE.sub(_escape, str(text))


def one_line(text: str, limit: int = 200) -> str:
    """The first non-empty line of `text`, made visible and cut at `limit` characters."""
    line = next((line.strip() for line in str(text).splitlines() if line.strip()), "")
    line = visible(line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
