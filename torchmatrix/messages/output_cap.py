"""A cap on what one test's output may add to the report: its head and tail, and how much was dropped.

A test that prints megabytes would otherwise make a JUnit text node too large to parse (libxml2
refuses text over 10 MB), and one test's output would cost the whole run's report.
"""

from __future__ import annotations

DEFAULT_CAP_BYTES = 1_000_000
HARD_LIMIT_BYTES = 8_000_000  # below libxml2's 10 MB text node limit, whatever cap was asked for


def cap_text(text: str, cap: int = DEFAULT_CAP_BYTES) -> str:
    """`text` if its UTF-8 form fits in `cap` bytes, else its head and tail around a marker naming the bytes dropped."""
    cap = min(cap, HARD_LIMIT_BYTES)
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= cap:
        return text
    half = cap // 2
    head = data[:half].decode("utf-8", "ignore")
    tail = data[len(data) - half :].decode("utf-8", "ignore")
    dropped = len(data) - len(head.encode("utf-8")) - len(tail.encode("utf-8"))
    return f"{head}\n[... torchmatrix dropped {dropped} bytes of output here (--output-cap {cap}) ...]\n{tail}"
