"""Channel values of `[torch].versions`: "nightly", "nightly-YYYYMMDD" and "rc" stand for builds on
PyTorch's nightly and test indexes, resolved to one concrete version when they install, so a matrix
hears about a break before the release exists.

Each value is also a plain file name (venvs, `torch-<V>` directories, JUnit), so no mapping is needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from torchmatrix.user_error import UserError

NIGHTLY, RC = "nightly", "rc"
DATED = re.compile(r"^nightly-(\d{8})$")
DEV_DATE = re.compile(r"\.dev(\d{8})")
CHANNEL_KEYS = (NIGHTLY, RC)
DEFAULT_URLS = {
    NIGHTLY: "https://download.pytorch.org/whl/nightly/cpu",
    RC: "https://download.pytorch.org/whl/test/cpu",
}
UNBLOCK_HINT = "set [report] prerelease_blocks = true or pass --prerelease-blocks to make them block"
INDEX_URL = re.compile(r"^(https?|file)://\S+$")


class ChannelError(UserError):
    """A channel value the index cannot resolve (no build of that date, no rc); the message says what to change."""


def channel_of(value: str) -> str | None:
    """ "nightly" for `nightly` and `nightly-YYYYMMDD`, "rc" for `rc`, None for a pinned release."""
    if value == NIGHTLY or DATED.match(value):
        return NIGHTLY
    return RC if value == RC else None


def date_of(value: str) -> str | None:
    """The `YYYYMMDD` of a dated nightly value or of a dev version (`2.16.0.dev20261201+cpu`)."""
    match = DATED.match(value) or DEV_DATE.search(value)
    return match[1] if match else None


def dated(version: str) -> str:
    """The channel value naming a dev build's date: `2.16.0.dev20261201+cpu` -> `nightly-20261201`."""
    return f"nightly-{date_of(version)}"


@dataclass(frozen=True)
class Channels:
    """`[torch.channels]`: the index of each channel (PEP 503 simple URLs; file:// for a local one)."""

    nightly: str = DEFAULT_URLS[NIGHTLY]
    rc: str = DEFAULT_URLS[RC]

    def url(self, value: str) -> str | None:
        """The index a channel value installs from; None for a pinned release."""
        channel = channel_of(value)
        return getattr(self, channel) if channel else None


def parse_channels(table: object, where) -> Channels:
    """`[torch.channels]` checked; `where` is the config's key path, which words the one-line error."""
    if table is None:
        return Channels()
    if not isinstance(table, dict):
        raise where.error("must be a table", 'write [torch.channels] with nightly = "<index url>"')
    for key, url in table.items():
        if key not in CHANNEL_KEYS:
            raise where.at(key).error("is not a channel", f"use one of: {', '.join(CHANNEL_KEYS)}")
        if not isinstance(url, str) or not INDEX_URL.match(url):
            raise where.at(key).error(f"{url!r} is not an index URL", f'write e.g. {key} = "{DEFAULT_URLS[key]}"')
    return Channels(**table)


def _versions(listed: list[str]) -> list[Version]:
    parsed = []
    for text in listed:
        try:
            parsed.append(Version(text))
        except InvalidVersion:
            continue
    return sorted(set(parsed))


def resolve(value: str, listed: list[str], url: str) -> str:
    """The concrete version (local label kept) `value` stands for among the versions `url` lists."""
    versions = _versions(listed)
    if value == RC:  # the test channel names its candidates 2.16.0 (or 2.16.0rc1): the newest that is no dev build
        found = [v for v in versions if not v.is_devrelease]
        what, fix = "no release candidate", "use a pinned release or nightly until the test channel has one"
    elif value == NIGHTLY:
        found = [v for v in versions if v.is_devrelease and date_of(str(v))]
        what, fix = (
            "no dated nightly build",
            "check [torch.channels] nightly, or pin a dated nightly already in the wheelhouse",
        )
    else:
        found = [v for v in versions if date_of(str(v)) == date_of(value)]
        dates = sorted({d for v in versions if (d := date_of(str(v)))})
        near = ", ".join(dates[-3:]) or "none"
        what, fix = f"no nightly build of {date_of(value)}", f"pick a date it lists (latest: {near})"
    if not found:
        raise ChannelError(f"torch {value}: {url} has {what}; {fix}")
    return str(found[-1])


def is_build_of(value: str, version: str) -> bool:
    """Whether the installed build `version` is one `value` resolves to (a venv kept from an earlier install)."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        return False
    if value == RC:
        return not parsed.is_devrelease
    return (
        parsed.is_devrelease
        and date_of(version) is not None
        and (value == NIGHTLY or date_of(version) == date_of(value))
    )


def dated_builds(listed: list[str], good: str, bad: str) -> list[str]:
    """The `nightly-YYYYMMDD` values of the dated builds strictly between two dated values, oldest first."""
    dates = {d for v in _versions(listed) if (d := date_of(str(v)))}
    return [f"nightly-{d}" for d in sorted(dates) if date_of(good) < d < date_of(bad)]


def wheel_version(path: Path) -> str | None:
    """The version in a wheel's file name (`torch-2.16.0.dev20261201+cpu-cp311-...whl`)."""
    parts = path.name.split("-")
    return parts[1] if len(parts) >= 5 and path.suffix == ".whl" else None


def cached_build(value: str, folder: Path | None) -> str | None:
    """The torch version a dated value's wheelhouse folder already holds, so it installs with the index gone."""
    if folder is None or not DATED.match(value) or not folder.is_dir():
        return None
    versions = [v for p in folder.glob("torch-*.whl") if (v := wheel_version(p)) and date_of(v) == date_of(value)]
    return max(versions, key=Version) if versions else None


def companion_pin(name: str, listed: list[str], version: str) -> str:
    """A companion (torchao, torchvision) from the channel's index of the same date as torch's
    build, else the newest before it; unpinned where the index lists no dated build."""
    date = date_of(version)
    if date is None:
        return name
    builds = [v for v in _versions(listed) if (d := date_of(str(v))) and d <= date]
    return f"{name}=={builds[-1]}" if builds else name
