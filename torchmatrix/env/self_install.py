"""How to install this same torchmatrix into another virtualenv (each torch version's nox venv):
the checkout it runs from, the path, URL or VCS commit pip installed it from (PEP 610's
direct_url.json), or its release on the index."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

import torchmatrix

DISTRIBUTION = "torchmatrix"


def install_arguments() -> list[str]:
    """`pip install` arguments for the torchmatrix this interpreter imports."""
    checkout = Path(torchmatrix.__file__).resolve().parent.parent
    try:
        distribution = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return arguments_for(checkout, None, torchmatrix.__version__)
    return arguments_for(checkout, distribution.read_text("direct_url.json"), distribution.version)


def arguments_for(package_parent: Path, direct_url: str | None, version: str) -> list[str]:
    """`-e CHECKOUT` where torchmatrix is imported from a source tree (editable, or on sys.path);
    else what `direct_url` (PEP 610) says pip installed it from; else the release `version`."""
    if (package_parent / "pyproject.toml").is_file() and (package_parent / "suites").is_dir():
        return ["-e", str(package_parent)]
    if direct_url:
        origin = json.loads(direct_url)
        url = origin["url"]
        if "vcs_info" in origin:
            vcs = origin["vcs_info"]
            return [f"{DISTRIBUTION} @ {vcs['vcs']}+{url}@{vcs['commit_id']}"]
        if origin.get("dir_info", {}).get("editable"):
            return ["-e", unquote(urlparse(url).path)]
        return [f"{DISTRIBUTION} @ {url}"]
    return [f"{DISTRIBUTION}=={version}"]
