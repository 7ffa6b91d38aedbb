"""The torch releases between two pins that a bisect may try: what the configured index offers
(`pip index versions torch`, pip's own configuration) and what `[torch.install."V"]` tables add
(a nightly index, a local wheel directory); between two dated nightlies, the dated builds the
nightly channel's index lists."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from torchmatrix.env import channel_install
from torchmatrix.env.channel_install import AVAILABLE_VERSIONS
from torchmatrix.matrix.channels import DATED, channel_of, date_of, dated_builds
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
    """The versions strictly between the pins, oldest first; between two dated nightlies, the
    `nightly-YYYYMMDD` values of the dated builds `offered` lists."""
    if DATED.match(good) or DATED.match(bad):
        if not (DATED.match(good) and DATED.match(bad)):
            raise VersionError(
                f"--good {good} --bad {bad}: a bisect by date takes two dated nightlies, e.g. --good nightly-20261201 --bad nightly-20261215"
            )
        if date_of(good) >= date_of(bad):
            raise VersionError(f"--good {good} is not older than --bad {bad}; the good pin is the older build")
        return dated_builds(offered, good, bad)
    low, high = parse_pin(good, "--good"), parse_pin(bad, "--bad")
    if low >= high:
        raise VersionError(f"--good {good} is not older than --bad {bad}; the good pin is the older release")
    inside = {Version(v) for v in offered if low < Version(v) < high}
    return [str(v) for v in sorted(inside)]


def index_listing(index_url: str | None, prereleases: bool) -> str:
    """`pip index versions torch` on pip's configured index, or on `index_url` (a version's own)."""
    return channel_install.index_listing("torch", index_url, prereleases)


def offered_versions(matrix: Matrix, good: str, bad: str) -> list[str]:
    """Every version the configured index and the matrix's per-version index URLs list, plus those
    `[torch.install]` names, between the pins."""
    if DATED.match(good) and DATED.match(bad):
        return between(good, bad, listed_versions(index_listing(matrix.install(good).index_url, True)))
    prereleases = parse_pin(good, "--good").is_prerelease or parse_pin(bad, "--bad").is_prerelease
    indexes = dict.fromkeys([None, *(install.index_url for install in matrix.installs.values() if install.index_url)])
    offered = [v for url in indexes for v in listed_versions(index_listing(url, prereleases))]
    named = [v for v in matrix.installs if v != "system" and channel_of(v) is None]
    return between(good, bad, [*offered, *named])
