"""The torch releases between two pins that a bisect may try: what the configured index offers
(`pip index versions torch`, pip's own configuration) and what `[torch.install."V"]` tables add
(a nightly index, a local wheel directory)."""

from __future__ import annotations

import subprocess
import sys

from packaging.version import InvalidVersion, Version

from torchmatrix.env.torch_install import AVAILABLE_VERSIONS
from torchmatrix.matrix.config import Matrix
from torchmatrix.user_error import UserError


class VersionError(UserError):
    """A pin that is not a version, or pins in the wrong order; the message says what to pass."""


def parse_pin(text: str, what: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise VersionError(f"{what} {text!r} is not a torch version; pass a release such as 2.13.0") from None


def listed_versions(index_versions_output: str) -> list[str]:
    """The releases `pip index versions torch` printed, local labels dropped (`torch==2.13.0`
    installs 2.13.0+cpu as well), unparsable entries left out."""
    listed = AVAILABLE_VERSIONS.search(index_versions_output)
    versions = []
    for text in listed[1].split(", ") if listed else []:
        try:
            versions.append(Version(text).public)
        except InvalidVersion:
            continue
    return list(dict.fromkeys(versions))


def between(good: str, bad: str, offered: list[str]) -> list[str]:
    """The versions strictly between the pins, oldest first."""
    low, high = parse_pin(good, "--good"), parse_pin(bad, "--bad")
    if low >= high:
        raise VersionError(f"--good {good} is not older than --bad {bad}; the good pin is the older release")
    inside = {Version(v) for v in offered if low < Version(v) < high}
    return [str(v) for v in sorted(inside)]


class IndexUnlisted(UserError):
    """`pip index versions torch` could not list an index: a search would try nothing; the message
    carries pip's reason."""


def index_listing(index_url: str | None, prereleases: bool) -> str:
    """`pip index versions torch` with this interpreter's pip (and `--index-url` for a version's own
    index); an index pip cannot list is an error, never an empty list."""
    command = [sys.executable, "-m", "pip", "index", "versions", "torch"]
    command += ["--pre"] if prereleases else []
    command += ["--index-url", index_url] if index_url else []
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not AVAILABLE_VERSIONS.search(done.stdout):
        said = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        reason = next((line for line in reversed(said) if line.startswith("ERROR")), said[-1] if said else "")
        where = index_url or "pip's configured index"
        raise IndexUnlisted(
            f"cannot list torch's releases on {where} (pip index versions torch exited {done.returncode}: "
            f"{reason or 'no output'}); fix the index or its network, then bisect again"
        )
    return done.stdout


def offered_versions(matrix: Matrix, good: str, bad: str) -> list[str]:
    """Every version the configured index and the matrix's per-version index URLs list, plus those
    `[torch.install]` names, between the pins."""
    prereleases = parse_pin(good, "--good").is_prerelease or parse_pin(bad, "--bad").is_prerelease
    indexes = dict.fromkeys([None, *(install.index_url for install in matrix.installs.values() if install.index_url)])
    offered = [v for url in indexes for v in listed_versions(index_listing(url, prereleases))]
    named = [v for v in matrix.installs if v != "system"]
    return between(good, bad, [*offered, *named])
