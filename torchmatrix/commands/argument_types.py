"""Argument types the commands share: argparse calls each on the text and prints its error as usage."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from torchmatrix.matrix.selection import SelectionError
from torchmatrix.matrix.suite_selection import split_test
from torchmatrix.matrix.torch_versions import is_torch_version, nearest_spelling


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; pass 0 to switch it off")
    return value


def seconds_or_unknown(text: str) -> float | None:
    """Seconds (0 or more), or None for 'unknown'."""
    if text == "unknown":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: pass seconds (0 or more) or 'unknown'")
    return value


def positive(text: str) -> int:
    return _positive_number(text, int, "a whole number", "pass 1 or more")


def positive_float(text: str) -> float:
    return _positive_number(text, float, "a number", "pass a number above 0, e.g. 0.5")


def _positive_number(text: str, parse, kind: str, hint: str):
    """`text` parsed above 0, so that a count and a fraction are refused in one wording."""
    try:
        value = parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not positive; {hint}")
    return value


def progress_part(text: str) -> tuple[int, int]:
    """`K/N`: this torch version is the K-th of the N one invocation runs."""
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise argparse.ArgumentTypeError(f"{text!r}: write it as K/N with 1 <= K <= N, e.g. 2/3")
    return int(match[1]), int(match[2])


def torch_version(text: str) -> str:
    """A torch version as matrix.toml spells one ("system" or PEP 440), since it names the run's
    `torch-<V>` directory: `/../../DIR` would put the run outside reports/."""
    if not is_torch_version(text):
        nearest = nearest_spelling(text)
        hint = f"did you mean {nearest!r}?" if nearest else "pass a release such as 2.13.0, or 'system'"
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch version pip can install; {hint}")
    return text


def interpreter(text: str) -> tuple[str, str]:
    """`VERSION=PATH`: the Python that stands for a torch version, an executable file."""
    version, _, python = text.partition("=")
    if not version or not python:
        raise argparse.ArgumentTypeError(f"{text!r}: write it as VERSION=PATH, e.g. 2.14.1=/opt/venv/bin/python")
    if not Path(python).is_file() or not os.access(python, os.X_OK):
        raise argparse.ArgumentTypeError(f"{python!r} is not an executable file; pass a venv's bin/python")
    return version, python


def suite_test(text: str) -> str:
    """`SUITE::TEST`, checked for its shape (the suite files check the names later)."""
    try:
        split_test(text)
    except SelectionError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix(f"--test {text!r}: ")) from None
    return text
