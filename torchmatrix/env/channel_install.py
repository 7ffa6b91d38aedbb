"""What a channel value ("nightly", "nightly-YYYYMMDD", "rc") installs: the concrete torch build
its index lists today, companions (torchao and the like) of the same date from the same index, or,
for a dated value, the build already in the wheelhouse, since nightlies leave the index after weeks.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from torchmatrix.matrix.channels import NIGHTLY, ChannelError, cached_build, channel_of, companion_pin, dated, resolve
from torchmatrix.matrix.config import TorchInstall

AVAILABLE_VERSIONS = re.compile(r"^Available versions: (.*)$", re.M)


class IndexUnlisted(ChannelError):
    """`pip index versions` could not list an index: nothing can be resolved; the message carries pip's reason."""


@dataclass(frozen=True)
class ChannelBuild:
    """A channel value resolved: the torch version to pin, the companions pinned beside it, the
    wheelhouse folder (None: none kept) and whether that folder already holds the build."""

    version: str
    requirements: tuple[str, ...]
    wheels: Path | None
    cached: bool


def listed_versions(output: str) -> list[str]:
    """The versions `pip index versions NAME` printed, newest first, local labels kept."""
    listed = AVAILABLE_VERSIONS.search(output)
    return listed[1].split(", ") if listed else []


def index_listing(name: str, index_url: str | None, prereleases: bool, env: dict[str, str] | None = None) -> str:
    """`pip index versions NAME` with this interpreter's pip (pip's configuration, `--index-url` for
    a channel's index); an index pip cannot list is an error, never an empty list."""
    command = [sys.executable, "-m", "pip", "index", "versions", name]
    command += ["--pre"] if prereleases else []
    command += ["--index-url", index_url] if index_url else []
    environment = {**os.environ, **(env or {})}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
    if done.returncode != 0 or not AVAILABLE_VERSIONS.search(done.stdout):
        said = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        reason = next((line for line in reversed(said) if line.startswith("ERROR")), said[-1] if said else "")
        where = index_url or "pip's configured index"
        raise IndexUnlisted(
            f"cannot list {name}'s releases on {where} (pip index versions {name} exited {done.returncode}: "
            f"{reason or 'no output'}); fix the index or its network, then try again"
        )
    return done.stdout


def channel_build(value: str, install: TorchInstall, folder_of: Callable[[str], Path | None]) -> ChannelBuild:
    """Resolve `value` on its index (or, for a dated value, in the wheelhouse first); `folder_of`
    names the wheelhouse folder of a cache name (torch_install.wheelhouse). A nightly is kept by
    date; an rc is not kept, since each candidate of a release carries the same version."""
    folder = folder_of(value)
    cached = cached_build(value, folder)
    if cached:
        return ChannelBuild(cached, install.requirements, folder, True)
    try:
        version = resolve(
            value, listed_versions(index_listing("torch", install.index_url, True, install.env)), install.index_url
        )
    except IndexUnlisted as error:
        raise ChannelError(f"torch {value}: {error}; or pin a dated nightly already in the wheelhouse") from None
    requirements = tuple(_companion(text, install, version) for text in install.requirements)
    wheels = folder_of(dated(version)) if channel_of(value) == NIGHTLY else None
    return ChannelBuild(version, requirements, wheels, False)


def _companion(text: str, install: TorchInstall, version: str) -> str:
    """A bare requirement name pinned to the build of torch's date on the same index; others, and
    names the channel does not list, as written."""
    try:
        requirement = Requirement(text)
    except InvalidRequirement:
        return text
    if requirement.specifier or requirement.url or requirement.extras or requirement.marker:
        return text
    try:
        listing = index_listing(requirement.name, install.index_url, True, install.env)
    except IndexUnlisted:  # not on the channel: pip's other indexes decide, as for a pin
        return text
    return companion_pin(requirement.name, listed_versions(listing), version)
