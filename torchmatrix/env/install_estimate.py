"""How long installing a torch version will take, from what pip would fetch: the ETA's install phases.

`pip install --dry-run --ignore-installed --report -` lists every file a fresh venv needs; each
costs its size to download unless the version's wheelhouse already holds it, and its size to
unpack (a venv is made fresh for each version). Sizes come from the file (`file://` indexes) or
the server's Content-Length; a file whose size cannot be learned makes the estimate unknown,
never a guess. The rates are priors measured on a 2-core machine (docs/explanation/performance.md).
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

DOWNLOAD_BYTES_PER_S = 50e6
"""Fetching into the wheelhouse: a file index copies, a CDN streams at about this rate."""
UNPACK_BYTES_PER_S = 30e6
"""pip's install step per byte of wheel: unzip, write, byte-compile; torch's 0.55 GB wheel takes ~20 s."""
FIXED_S = 25.0
"""What an install costs whatever its size: the venv, pip's resolve (twice: download, then install), this torchmatrix."""
SIZE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class InstallEstimate:
    """Bytes a version's install downloads (what its wheelhouse lacks) and unpacks (everything)."""

    download_bytes: int
    unpack_bytes: int

    @property
    def seconds(self) -> float:
        return FIXED_S + self.download_bytes / DOWNLOAD_BYTES_PER_S + self.unpack_bytes / UNPACK_BYTES_PER_S

    def describe(self) -> str:
        """`2.8 GB to download, 2.9 GB to unpack, about 2:00`."""
        download = f"{self.download_bytes / 1e9:.1f} GB to download" if self.download_bytes else "nothing to download"
        total = round(self.seconds)
        return f"{download}, {self.unpack_bytes / 1e9:.1f} GB to unpack, about {total // 60}:{total % 60:02d}"


def estimate_from_report(
    report: dict, cached: Iterable[str], size_of: Callable[[str], int | None]
) -> InstallEstimate | None:
    """The estimate for the files pip's `--report` lists, those named in `cached` (file names)
    downloading nothing; None when the report is not one or a file's size is unknown."""
    items = report.get("install") if isinstance(report, dict) else None
    if not isinstance(items, list):
        return None
    cached = set(cached)
    download = unpack = 0
    for item in items:
        url = (item.get("download_info") or {}).get("url", "") if isinstance(item, dict) else ""
        size = size_of(url) if url else None
        if size is None:
            return None
        unpack += size
        if file_name(url) not in cached:
            download += size
    return InstallEstimate(download, unpack)


def file_name(url: str) -> str:
    return unquote(Path(urlparse(url).path).name)


def url_size(url: str) -> int | None:
    """Bytes of the file at `url`: a local file's size, an HTTP server's Content-Length; None when neither says."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        try:
            return Path(unquote(parsed.path)).stat().st_size
        except OSError:
            return None
    if parsed.scheme not in ("http", "https"):
        return None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=SIZE_TIMEOUT_S) as response:
            length = response.headers.get("Content-Length")
    except (OSError, ValueError):
        return None
    return int(length) if length and length.isdigit() else None


def estimate_install(
    python: str, arguments: list[str], cached: Iterable[str], env: Mapping[str, str]
) -> InstallEstimate | None:
    """Ask `python`'s pip what `pip install ARGUMENTS` fetches into a fresh venv (with `env`),
    and estimate it, the files named in `cached` downloading nothing; None when pip cannot say
    (an old pip, no index, nothing resolves)."""
    command = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-"]
    try:
        done = subprocess.run(
            [*command, *arguments], capture_output=True, text=True, check=False, timeout=600, env=dict(env)
        )
        report = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    if report is None:
        return None
    return estimate_from_report(report, cached, url_size)


def wheelhouse_files(wheelhouse: Path | None) -> list[str]:
    """The file names a wheelhouse holds now (none without one): what an install will not download."""
    return [path.name for path in wheelhouse.iterdir()] if wheelhouse and wheelhouse.is_dir() else []


@dataclass
class InstallPace:
    """How this invocation's installs went against their estimates: the later ones are scaled by
    it, so a loaded machine, a slow disk or network counts once the first install is measured."""

    estimated: float = 0.0
    measured: float = 0.0

    def record(self, estimate: InstallEstimate | None, seconds: float) -> None:
        if estimate is not None:
            self.estimated += estimate.seconds
            self.measured += seconds

    def seconds(self, estimate: InstallEstimate) -> float:
        """`estimate`'s seconds at the pace measured so far (the priors' own before any)."""
        return estimate.seconds * (self.measured / self.estimated if self.estimated else 1.0)
