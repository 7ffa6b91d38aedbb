"""Fake torch releases that install in seconds: a wheel named torch V whose only content is a .pth
putting this test's own torch on sys.path, so a nox or bisect venv for "torch V" runs the real torch
without unpacking it again."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from torchmatrix.env.torch_install import pip_index_options

from helpers.checkout import unconstrained_pip


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def fake_torch_wheel(
    directory: Path, version: str, torch_site: Path, requires: tuple[str, ...] = (), import_error: str = ""
) -> Path:
    """A wheel named torch `version` whose only content is a .pth putting `torch_site` on sys.path
    (with `import_error`, also a torch package, found first, that raises it)."""
    info = f"torch-{version}.dist-info"
    kind, _, message = import_error.partition(": ")
    broken = {"torch/__init__.py": f"raise {kind}({message!r})\n".encode()} if import_error else {}
    files = {
        **broken,
        "torch_release_shim.pth": f"{torch_site}\n".encode(),
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires)
        ).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: torchmatrix-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "\n".join([*(_record_line(n, d) for n, d in files.items()), f"{info}/RECORD,,"]) + "\n"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in [*files.items(), (f"{info}/RECORD", record.encode())]:
            wheel.writestr(name, data)
    return path


def torch_site() -> Path:
    """The site-packages this test's torch comes from. torchmatrix is installed there editable, through
    a .pth hook that a plain path entry does not run, so a fake release's venv does not import it from there."""
    import torch

    return Path(torch.__file__).resolve().parents[1]


def torch_requirements() -> tuple[str, ...]:
    """This torch's own dependencies (those no extra asks for), so a fake release pulls what torch's wheel does."""
    return tuple(r for r in metadata.requires("torch") or () if "extra ==" not in r)


def configured_find_links() -> list[str]:
    """pip's configured find-links (file and environment), which the fake releases join."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    options = pip_index_options(listing)
    return [options[i + 1] for i, option in enumerate(options) if option == "--find-links"]


def offering(wheels: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with pip finding the releases in `wheels` beside its own find-links, and no torch cap."""
    return {**unconstrained_pip(environ), "PIP_FIND_LINKS": " ".join([str(wheels), *configured_find_links()])}
