"""The package's layers as a graph: each layer names the layers it may import from, and the two
sides of a run, the runner (run/, reports/, scale/, commands/) and the pytest side (ranks/), both
stand on messages/ (what crosses between them) and forks/ (how their processes are born and die),
never on each other."""

from __future__ import annotations

import ast
import re
from graphlib import TopologicalSorter
from pathlib import Path

import torchmatrix

# Each layer and every layer its modules may import from; "top" is every module directly under
# torchmatrix/ except the foundation's.
MAY_IMPORT = {
    "status": set(),
    "components": {"status"},
    "matrix": {"status", "components"},
    "env": {"status", "matrix"},
    "messages": {"status", "components", "matrix", "env"},
    "forks": {"status"},
    "ranks": {"status", "components", "matrix", "env", "messages", "forks"},
    "reports": {"status", "matrix", "env", "messages"},
    "run": {"status", "components", "matrix", "env", "messages", "forks", "reports"},
    "scale": {"status", "matrix", "env", "messages", "reports", "run"},
    "sensitivity": {"status", "components", "matrix", "messages", "ranks", "reports", "run"},
    "bisect": {"status", "matrix", "env", "messages", "reports", "run"},
    "repro": {"status", "components", "matrix", "env", "messages", "ranks", "reports"},
    "commands": {"status", "matrix", "env", "messages", "reports", "run", "scale", "sensitivity", "bisect", "repro"},
    "top": {"status", "components", "matrix", "env", "messages", "ranks", "reports", "run", "commands"},
}
LAYERS = list(TopologicalSorter(MAY_IMPORT).static_order())
RUNNER_SIDE = {"run", "reports", "scale", "commands"}
PYTEST_SIDE = {"ranks"}
PACKAGE = Path(torchmatrix.__file__).parent
# The first layer, "status": the outcome and exit-code vocabulary, the user-error base, the file writer and the
# dataclass <-> JSON forms every layer uses.
FOUNDATION = {
    "torchmatrix",
    "torchmatrix.status",
    "torchmatrix.exit_codes",
    "torchmatrix.user_error",
    "torchmatrix.file_writes",
    "torchmatrix.json_records",
}


def layer_of(module: str) -> str:
    """A subpackage's name, "status" for the foundation's modules (the bare package's __init__ holds only the version), else "top"."""
    if module in FOUNDATION:
        return "status"
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    return "top"


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, imported torchmatrix module) for every import in the file, function-level ones too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torchmatrix":
            names = (
                [f"{node.module}.{alias.name}" for alias in node.names]
                if node.module == "torchmatrix"
                else [node.module]
            )
            found += [(node.lineno, name) for name in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "torchmatrix"]
    return found


def forbidden_imports(root: Path) -> list[str]:
    problems = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        here = layer_of(module)
        for line, imported in imports_of(path):
            there = layer_of(imported)
            if there != here and there not in MAY_IMPORT[here]:
                problems.append(f"{module}:{line} imports {imported} ({here} may not import {there})")
    return problems


def test_the_graph_has_no_cycle_and_the_two_sides_share_only_what_crosses():
    assert LAYERS[0] == "status" and LAYERS[-1] == "top"  # TopologicalSorter raises on a cycle
    for side, other in ((RUNNER_SIDE, PYTEST_SIDE), (PYTEST_SIDE, RUNNER_SIDE)):
        assert all(not MAY_IMPORT[layer] & other for layer in side)
    assert {"messages", "forks"} <= MAY_IMPORT["run"] & MAY_IMPORT["ranks"]


def test_every_subpackage_is_a_known_layer():
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert packages == set(LAYERS) - {"status", "top"}


def test_every_import_follows_the_graph():
    assert forbidden_imports(PACKAGE) == []


def test_an_import_off_the_graph_is_reported(tmp_path):
    package = tmp_path / "torchmatrix"
    (package / "matrix").mkdir(parents=True)
    (package / "matrix" / "config.py").write_text("from torchmatrix.reports.junit import merge\n")
    (package / "run").mkdir()
    (package / "run" / "runner.py").write_text("from torchmatrix.ranks.plugin import planned_options\n")
    assert forbidden_imports(package) == [
        "torchmatrix.matrix.config:1 imports torchmatrix.reports.junit (matrix may not import reports)",
        "torchmatrix.run.runner:1 imports torchmatrix.ranks.plugin (run may not import ranks)",
    ]


# What run/ uses of reports/: the writers of a run's reports, the words of a confirmation note,
# and results.json's name (the ETA reads earlier runs). The ledger, the confirmation re-runs and
# the rebuild of a killed runner's cells are run/'s own, so a run steps into reports/ only to write.
RUN_USES_OF_REPORTS = {
    "torchmatrix.reports.junit",
    "torchmatrix.reports.report",
    "torchmatrix.reports.confirmation_notes",
    "torchmatrix.reports.results_json",
}


def run_imports_of_reports(root: Path) -> list[str]:
    """`module:line imports reports.X` for every import of reports/ in run/ beyond RUN_USES_OF_REPORTS."""
    found = []
    for path in sorted((root / "run").rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "torchmatrix.reports":
                imported = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torchmatrix.reports."):
                imported = [node.module]
            elif isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names if alias.name.startswith("torchmatrix.reports")]
            else:
                continue
            found += [f"{module}:{node.lineno} imports {name}" for name in imported if name not in RUN_USES_OF_REPORTS]
    return found


def test_the_run_steps_into_reports_only_to_write_them():
    assert run_imports_of_reports(PACKAGE) == []


def test_a_run_module_reading_the_report_layer_is_reported(tmp_path):
    package = tmp_path / "torchmatrix"
    (package / "run").mkdir(parents=True)
    (package / "run" / "runner.py").write_text(
        "from torchmatrix.reports import junit\nfrom torchmatrix.reports.summary_data import count\n"
    )
    assert run_imports_of_reports(package) == ["torchmatrix.run.runner:2 imports torchmatrix.reports.summary_data"]


def layer_table() -> dict[str, set[str]]:
    """{layer: modules} as docs/development.md's layer table names them."""
    table = {}
    for row in (PACKAGE.parent / "docs" / "development.md").read_text().splitlines():
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in {"layer", "---"}:
            table[cells[0].strip("`").rstrip("/")] = set(re.findall(r"`(\w+)`", cells[1]))
    return table


def test_the_development_page_names_every_module_in_its_layer():
    modules = {layer: set() for layer in LAYERS}
    for path in PACKAGE.rglob("*.py"):
        if path.name in {"__init__.py", "__main__.py"}:
            continue
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        modules[layer_of(module)].add(path.stem)
    assert layer_table() == modules
