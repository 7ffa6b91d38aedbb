"""The source of every module a suite check needs besides torch and third-party packages, found by
following its imports, so a reproducer carries the suite, its helpers, the components and the few
torchmatrix pieces they use, and runs where torchmatrix is not installed.

`torchmatrix.testing` is replaced by a stand-in with the same names whose `current_device` reads
the rank's environment alone (the real one lives beside the rank pool, which the script replaces).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
from pathlib import Path

import torchmatrix
from torchmatrix.components.loading import IMPORT_PATH
from torchmatrix.ranks import worker

TESTING = "torchmatrix.testing"
NOT_CARRIED = ("torchmatrix.ranks.plugin", "torchmatrix.ranks.worker", "torchmatrix.messages.cross_version")
"""What torchmatrix.testing imports from the runner and the run directory's layout: the stand-in has
its own current_device, and no plan or run directory to read; every other import, the script carries."""
HARNESS_NEEDS = ("torchmatrix.messages.root_cause", "torchmatrix.matrix.cells")
INSTALLED_PACKAGES = ("site-packages", "dist-packages")


def testing_stand_in() -> str:
    """torchmatrix.testing for the script: its imports, and current_device from the rank's environment."""
    real = Path(inspect.getsourcefile(sys.modules.get(TESTING) or importlib.import_module(TESTING))).read_text()
    kept = [
        ast.get_source_segment(real, node)
        for node in ast.parse(real).body
        if isinstance(node, ast.ImportFrom) and node.module not in NOT_CARRIED
    ]
    return "\n".join(
        [
            '"""torchmatrix.testing for a standalone reproducer: what a suite may use, and nothing else."""',
            "",
            "import os",
            "",
            *kept,
            "",
            "",
            inspect.getsource(worker.current_device),
        ]
    )


def module_name_of(path: Path) -> tuple[str, Path]:
    """A file's module name as pytest's rootdir-less import gives it (up through __init__.py
    directories), and the directory that name is relative to."""
    parts = [path.stem]
    directory = path.parent
    while (directory / "__init__.py").is_file():
        parts.insert(0, directory.name)
        directory = directory.parent
    return ".".join(parts), directory


def relative_file(name: str, is_package: bool) -> str:
    return "/".join(name.split(".")) + ("/__init__.py" if is_package else ".py")


class Inliner:
    """Collects {relative path: source} for the modules reachable from a suite and its components."""

    def __init__(self, search: list[Path]):
        self.search = [str(path) for path in search]
        self.sources: dict[str, str] = {}
        self.seen: set[str] = set()
        self.package_dirs = {str(Path(torchmatrix.__file__).resolve().parent)} | {
            location
            for package in ("torchmatrix.suites", "torchmatrix.models")
            if (spec := importlib.util.find_spec(package)) and spec.submodule_search_locations
            for location in spec.submodule_search_locations
        }

    def add_file(self, name: str, path: Path) -> None:
        """A module given by its file (the suite), under `name`."""
        self._add(name, path.read_text(), is_package=path.name == "__init__.py")

    def add_module(self, name: str) -> None:
        """A module given by its name, inlined when it is the project's own code (not installed packages)."""
        if name in self.seen:
            return
        self.seen.add(name)
        if name == TESTING:
            self._add(name, testing_stand_in(), is_package=False)
            return
        origin, is_package = self._find(name)
        if origin is not None:
            self._add(name, origin.read_text(), is_package=is_package)

    def add_components(self, import_paths: list[str]) -> None:
        for import_path in import_paths:
            if IMPORT_PATH.match(import_path):
                self.add_module(import_path.partition(":")[0])

    def _find(self, name: str) -> tuple[Path | None, bool]:
        """The file of `name` when it is the project's own; a dotted name is looked up only below a
        package of the project (find_spec imports the parents, and torch is not to be imported here)."""
        top = name.partition(".")[0]
        if top != name and self._find(top)[0] is None:
            return None, False
        saved = sys.path[:]
        sys.path[:0] = self.search
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None, False
        finally:
            sys.path[:] = saved
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return None, False
        origin = Path(spec.origin).resolve()
        ours = any(origin.is_relative_to(directory) for directory in self.package_dirs)
        if not ours and (
            any(part in INSTALLED_PACKAGES for part in origin.parts)
            or not any(origin.is_relative_to(Path(directory).resolve()) for directory in self.search)
        ):
            return None, False
        return origin, spec.submodule_search_locations is not None

    def _add(self, name: str, source: str, *, is_package: bool) -> None:
        self.seen.add(name)
        self.sources[relative_file(name, is_package)] = source
        package = name if is_package else name.rpartition(".")[0]
        parents = name.split(".")[:-1]
        for index in range(1, len(parents) + 1):
            parent = ".".join(parents[:index])
            self.add_module(parent)
            self.sources.setdefault(relative_file(parent, True), "")
        for imported in imports_of(source, package):
            self.add_module(imported)


def imports_of(source: str, package: str) -> list[str]:
    """Absolute names of the modules `source` imports (and `from X import y` as X.y, which may be a module)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module:
                names.append(module)
            names += [f"{module}.{alias.name}" if module else alias.name for alias in node.names]
    return names


def inline_check(suite_file: Path, component_paths: list[str], matrix_root: Path) -> tuple[dict[str, str], str]:
    """The sources a reproducer needs for this suite and these components, and the suite's relative path among them."""
    name, base = module_name_of(suite_file.resolve())
    inliner = Inliner([base, matrix_root])
    inliner.add_file(name, suite_file)
    inliner.add_components(component_paths)
    for needed in HARNESS_NEEDS:
        inliner.add_module(needed)
    return inliner.sources, relative_file(name, False)
