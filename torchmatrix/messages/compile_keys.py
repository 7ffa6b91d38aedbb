"""The key of a folder in the compile store: everything a cached graph or kernel depends on that its
cell id does not already say, so that a hit can never be wrong.

A key changes with the torch build (version, git revision, CUDA, HIP and Triton), the interpreter and
machine, the C++ compiler Inductor builds kernels with, the device the ranks compute on, the sources
of the suites and of every package a component comes from, and the matrix's components and suite
options. The cell id adds the world size, mesh and every other axis; the rank adds the shard.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path


def key_facts(*, matrix_digest: str, device: dict, components: dict, suite_files: Iterable[Path]) -> dict:
    """What the key of this process's compile folders is made of."""
    return key_of(build_facts(components=components, suite_files=suite_files), device, matrix_digest)


def key_of(build: dict, device: dict, matrix_digest: str) -> dict:
    """A key's facts from its build facts, the device the ranks compute on and the matrix's digest: how a
    rank and the runner (which has the build facts from the component check's child) both compose it."""
    return {**build, "device": device, "matrix": matrix_digest}


def build_facts(*, components: dict, suite_files: Iterable[Path]) -> dict:
    """The key's facts that only an interpreter of the torch environment can say: the torch build, the
    interpreter and machine, the C++ compiler, the sources (the runner, which never imports torch, has
    them from the component check's child for its ETA and adds the device and the matrix's digest)."""
    import torch

    return {
        "torch": torch.__version__,
        "git_version": torch.version.git_version,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "triton": _triton_version(),
        "python": sys.version,
        "machine": platform.machine(),
        "compiler": compiler_version(),
        "sources": sources_digest(source_files(components, suite_files)),
    }


def compiler_version() -> str:
    """The first line of `--version` of the C++ compiler Inductor builds CPU kernels with: `$CXX`, else
    its default, read as Inductor's config does (`cpp.cxx`) without importing Inductor, which an eager
    cell's pytest process never needs."""
    compiler = os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return f"{compiler}: not found"
    return f"{compiler}: {(done.stdout.splitlines() or [''])[0]}"


def source_files(components: dict, suite_files: Iterable[Path]) -> list[Path]:
    """The Python files a compiled graph can come from: every file of each package on a component's
    import path (a module imports its siblings; an editable install may map a subpackage to a folder
    of its own), the files beside a top-level module, and the suites' files (with their helper
    sub-packages, where the suites' folder is a package)."""
    folders: set[Path] = set()
    files: set[Path] = set()
    for target in components.values():
        module = str(target).partition(":")[0]
        leaf = _spec(module)  # imports the packages above it, whose __path__ is then as they run
        if leaf is None:
            continue
        parts = module.split(".")
        for depth in range(1, len(parts)):
            folders.update(
                Path(location) for location in getattr(sys.modules.get(".".join(parts[:depth])), "__path__", ())
            )
        if leaf.submodule_search_locations:
            folders.update(Path(location) for location in leaf.submodule_search_locations)
        elif len(parts) == 1 and leaf.origin and leaf.origin.endswith(".py"):
            files.update(Path(leaf.origin).parent.glob("*.py"))
    for suite in suite_files:
        folder = Path(suite).resolve().parent
        files.update(folder.rglob("*.py") if (folder / "__init__.py").is_file() else folder.glob("*.py"))
    for folder in folders:
        files.update(folder.rglob("*.py"))
    return sorted(files)


def _spec(name: str):
    """The module's spec, or None where it cannot be found (the component check reports that)."""
    try:
        return importlib.util.find_spec(name) if name else None
    except (ImportError, ValueError):
        return None


def sources_digest(files: Iterable[Path]) -> str:
    """One digest of the files' paths and contents."""
    digest = hashlib.sha256()
    for path in files:
        try:
            content = path.read_bytes()
        except OSError:
            continue
        digest.update(str(path).encode() + b"\0" + hashlib.sha256(content).digest())
    return digest.hexdigest()[:20]


def _triton_version() -> str | None:
    spec = importlib.util.find_spec("triton")
    if spec is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triton")
    except PackageNotFoundError:  # a triton importable without distribution metadata
        return "unknown"
