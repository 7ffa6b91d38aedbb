"""How matrix.toml spells a torch version: "system", a PEP 440 version pip can install, or a channel
value ("nightly", "nightly-YYYYMMDD", "rc": matrix/channels.py), checked when the matrix loads, with the nearest valid spelling of a typo (`2.13.0cu121` -> `2.13.0+cu121`)."""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version

from torchmatrix.matrix.channels import channel_of

SYSTEM = "system"
PLAIN = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z]+[0-9]*)?(\.[a-z]+[0-9]+)*(\+[A-Za-z0-9.]+)?$")
"""Also a file name: `torch-<V>` directories and `gpu_matrix-torch-<V>` venvs are named after it."""


def is_torch_version(text: object) -> bool:
    """Whether `text` is "system", a channel value, or a version pip accepts that is also a plain file name."""
    if text == SYSTEM or (isinstance(text, str) and channel_of(text)):
        return True
    if not isinstance(text, str) or not PLAIN.match(text):
        return False
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def nearest_spelling(text: str) -> str | None:
    """A valid version one typo away from `text`: a local label (`cu121`) without its `+` or after
    `-`/`_`, a leading `v`, surrounding blanks; None when there is none."""
    stripped = text.strip()
    candidates = [stripped, stripped.lstrip("vV"), stripped.replace("@", "-")]
    for index, character in enumerate(stripped):
        if character in "-_":
            candidates.append(f"{stripped[:index]}+{stripped[index + 1 :]}")
        elif character.isalpha() and index and stripped[index - 1].isdigit():
            candidates.append(f"{stripped[:index]}+{stripped[index:]}")
    return next((c for c in candidates if c != text and is_torch_version(c)), None)
