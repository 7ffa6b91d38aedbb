"""Every file torchmatrix writes replaces a symlink planted at its name instead of writing through it
(the link's target, a stand-in for ~/.bashrc, stays as it was), or refuses it when the file grows
as it is written; and no module of the package writes a file any other way."""

from __future__ import annotations

import ast
import errno
import json
from pathlib import Path

import pytest

import torchmatrix
from torchmatrix import cli, file_writes
from torchmatrix.matrix.config import load_matrix
from torchmatrix.messages.events import EventLog
from torchmatrix.messages.grant import Grant
from torchmatrix.messages.run_plan import RunPlan, write_plan
from torchmatrix.reports import junit
from torchmatrix.reports.report import write_report
from torchmatrix.scale.slurm import SlurmOptions, write_slurm

from helpers.report_runs import write_fixture_run

PRECIOUS = "export PATH=/usr/bin  # the user's own\n"


@pytest.fixture
def plant(tmp_path):
    """Plant a symlink at a path torchmatrix will write, leading to a file outside; return its target."""
    target = tmp_path / "home" / ".bashrc"
    target.parent.mkdir()
    target.write_text(PRECIOUS)

    def planted(path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
        return target

    return planted


def replaced(path: Path, target: Path) -> bool:
    """The symlink at `path` is now a regular file of its own, and `target` is as it was."""
    return path.is_file() and not path.is_symlink() and target.read_text() == PRECIOUS


def test_report_replaces_symlinks_at_each_report_it_writes(tmp_path, plant):
    run_dir = write_fixture_run(tmp_path / "project")
    names = ("summary.md", "summary.html", "results.json", "junit.xml")
    targets = {name: plant(run_dir / name) for name in names}
    write_report(run_dir)
    assert all(replaced(run_dir / name, targets[name]) for name in names)
    assert json.loads((run_dir / "results.json").read_text())["schema"] == "torchmatrix.results"
    assert not list(run_dir.glob(".*.partial"))


def test_compare_out_replaces_a_symlink(tmp_path, plant, capsys):
    run_dir = write_fixture_run(tmp_path / "project")
    out = tmp_path / "diff.md"
    target = plant(out)
    cli.main(["compare", str(run_dir), str(run_dir), "--out", str(out)])
    assert replaced(out, target) and out.read_text().startswith("## torchmatrix compare")


def test_cell_junit_plan_and_grant_replace_symlinks(tmp_path, plant):
    cell_report, plan, gate = tmp_path / "ws1.xml", tmp_path / "torch-2.13.0" / "plan.json", tmp_path / "ws1.go"
    targets = [plant(path) for path in (cell_report, plan, gate)]
    junit.write_suites(cell_report, [])
    write_plan(plan.parent, RunPlan("2.13.0"))
    Grant.for_group(1, 1).write(gate)
    assert all(replaced(path, target) for path, target in zip((cell_report, plan, gate), targets))


def test_slurm_scripts_replace_symlinks(tmp_path, plant):
    root = tmp_path / "project"
    (root / "suites").mkdir(parents=True)
    (root / "suites" / "test_demo.py").write_text("def test_x(cell):\n    pass\n")
    (root / "matrix.toml").write_text(
        '[torch]\nversions = ["2.13.0"]\n[axes]\nworld_size = [1]\n[suites.demo]\npath = "suites/test_demo.py"\n'
    )
    out = tmp_path / "slurm"
    target = plant(out / "submit.sh")
    write_slurm(load_matrix(root / "matrix.toml"), SlurmOptions(1, 2), out, only={}, keyword=None, filter_args=[])
    assert replaced(out / "submit.sh", target)


def test_a_growing_file_refuses_a_symlink(tmp_path, plant):
    events = tmp_path / "ws1.events.jsonl"
    target = plant(events)
    with pytest.raises(OSError) as refused:
        EventLog(events)
    assert refused.value.errno == errno.ELOOP and target.read_text() == PRECIOUS


def test_a_failed_write_leaves_the_old_file_whole_and_no_partial(tmp_path):
    path = file_writes.write_text(tmp_path / "results.json", "old")
    with pytest.raises(RuntimeError), file_writes.replacing(path) as temporary:
        temporary.write_text("half")
        raise RuntimeError("the disk filled")
    assert path.read_text() == "old" and list(tmp_path.iterdir()) == [path]


# Calls that write a file by its name; the writer module is the one place that may make them.
WRITING_METHODS = {"write_text", "write_bytes", "touch"}
WRITING_FUNCTIONS = {"copyfile", "copy", "copy2", "copytree"}
# The runtimes copied into a repro.py: they run where torchmatrix is not installed, writing only into
# a temporary directory of their own.
REPRO_RUNTIMES = ("repro/harness.py", "repro/checkpoint_script.py")


def direct_writes(source: str) -> list[int]:
    """Lines of `source` that write a file without torchmatrix.file_writes: Path.write_text and friends,
    shutil copies without its copy_function, open() for writing, os.open without O_NOFOLLOW."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
        owner = getattr(function.value, "id", "") if isinstance(function, ast.Attribute) else ""
        keywords = {keyword.arg for keyword in node.keywords}
        if owner == "file_writes":
            continue
        if isinstance(function, ast.Attribute) and name in WRITING_METHODS:
            lines.append(node.lineno)
        elif owner == "shutil" and name in WRITING_FUNCTIONS and "copy_function" not in keywords:
            lines.append(node.lineno)
        elif name == "open" and owner == "" and len(node.args) > 1:
            mode, first = node.args[1], node.args[0]
            writes = isinstance(mode, ast.Constant) and any(flag in str(mode.value) for flag in "wax")
            if writes and not (isinstance(first, ast.Constant) and isinstance(first.value, int)):  # an fd
                lines.append(node.lineno)
        elif (
            name == "open"
            and owner == "os"
            and "O_CREAT" in ast.unparse(node)
            and "O_NOFOLLOW" not in ast.unparse(node)
        ):
            lines.append(node.lineno)
    return lines


def test_no_module_writes_a_file_around_the_writer():
    package = Path(torchmatrix.__file__).parent
    found = {
        str(path.relative_to(package)): lines
        for path in sorted(package.rglob("*.py"))
        if path.name != "file_writes.py" and str(path.relative_to(package)) not in REPRO_RUNTIMES
        if (lines := direct_writes(path.read_text()))
    }
    assert found == {}


def test_the_check_finds_each_way_around_the_writer():
    source = """
import os, shutil
from pathlib import Path
Path("a").write_text("x")
shutil.copyfile("a", "b")
open("c", "w")
os.open("d", os.O_WRONLY | os.O_CREAT)
open(1, "w", closefd=False)
open("e")
os.open("f", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW)
file_writes.write_text(Path("g"), "x")
shutil.copytree("h", "i", copy_function=file_writes.copy_file)
"""
    assert direct_writes(source) == [4, 5, 6, 7]
