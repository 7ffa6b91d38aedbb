"""How long installing a torch version will take, from what pip would fetch: the ETA's install phases.

`pip install --dry-run --ignore-installed --report -` lists every file a fresh venv needs; each
costs its size to download unless the version's wheelhouse already holds it (to copy, from a
`file://` index on this machine), and its size to unpack (a venv is made fresh for each version). Sizes come from the file (`file://` indexes) or
the server's Content-Length; a file whose size cannot be learned makes the estimate unknown,
never a guess. Besides the bytes, an install has a part bound by the CPU (the venv, pip's
resolve, byte-compiling torch's Python files) that a loaded machine stretches many times over:
InstallPace scales it by what the installs measured so far took. The priors were measured on a
2-core machine (docs/explanation/performance.md#the-eta).
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
"""Fetching into the wheelhouse from a server: a CDN streams at about this rate."""
COPY_BYTES_PER_S = 300e6
"""Fetching into the wheelhouse from a `file://` index: a copy on local disk (3.0 GB in 10 s, measured
with torch 2.14.1's CUDA wheels on the 2-core machine)."""
UNPACK_BYTES_PER_S = 100e6
"""pip writing a wheel's files into the venv, per byte of wheel, on an idle machine: torch 2.14.1's CUDA
build (3.0 GB of wheels) took 28 s longer than 2.13.0's CPU build (0.22 GB); torch's own thousands of
small files, the same in both, are in the CPU-bound part."""
CPU_S = 60.0
"""The part of an install bound by the CPU on an idle machine, whatever its size: the venv, pip's
resolve (twice: download, then install), byte-compiling torch's Python files, this torchmatrix."""
SIZE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class InstallEstimate:
    """Bytes a version's install downloads from a server and copies from a local index (what its
    wheelhouse lacks), and unpacks (everything)."""

    download_bytes: int
    unpack_bytes: int
    copy_bytes: int = 0

    @property
    def bytes_seconds(self) -> float:
        """The part the bytes take: fetching and writing them."""
        fetching = self.download_bytes / DOWNLOAD_BYTES_PER_S + self.copy_bytes / COPY_BYTES_PER_S
        return fetching + self.unpack_bytes / UNPACK_BYTES_PER_S

    @property
    def seconds(self) -> float:
        return CPU_S + self.bytes_seconds

    def describe(self) -> str:
        """`2.8 GB to download, 2.9 GB to unpack`; what a local index holds is `to copy`."""
        fetched = [f"{self.download_bytes / 1e9:.1f} GB to download"] if self.download_bytes else []
        fetched += [f"{self.copy_bytes / 1e9:.1f} GB to copy from a local index"] if self.copy_bytes else []
        return f"{', '.join(fetched) or 'nothing to download'}, {self.unpack_bytes / 1e9:.1f} GB to unpack"


def estimate_from_report(
    report: dict, cached: Iterable[str], size_of: Callable[[str], int | None]
) -> InstallEstimate | None:
    """The estimate for the files pip's `--report` lists, those named in `cached` (file names)
    downloading nothing; None when the report is not one or a file's size is unknown."""
    items = report.get("install") if isinstance(report, dict) else None
    if not isinstance(items, list):
        return None
    cached = set(cached)
    download = copy = unpack = 0
    for item in items:
        url = (item.get("download_info") or {}).get("url", "") if isinstance(item, dict) else ""
        size = size_of(url) if url else None
        if size is None:
            return None
        unpack += size
        if file_name(url) in cached:
            continue
        if urlparse(url).scheme == "file":
            copy += size
        else:
            download += size
    return InstallEstimate(download, unpack, copy)


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
    """How this invocation's installs went against their estimates: the CPU-bound part of the
    later ones is scaled by it, so a loaded machine counts once the first install is measured."""

    cpu_estimated: float = 0.0
    cpu_measured: float = 0.0

    def record(self, estimate: InstallEstimate | None, seconds: float) -> None:
        """An install that took `seconds`: what its bytes did not take went to the CPU-bound part."""
        if estimate is not None:
            self.cpu_estimated += CPU_S
            self.cpu_measured += max(seconds - estimate.bytes_seconds, 0.0)

    def seconds(self, estimate: InstallEstimate) -> float:
        """`estimate`'s seconds, its CPU-bound part at the pace measured so far (the prior's before any)."""
        factor = self.cpu_measured / self.cpu_estimated if self.cpu_estimated else 1.0
        return CPU_S * factor + estimate.bytes_seconds
