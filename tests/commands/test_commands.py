"""The commands' registry and the checks they share: a run directory or exit 2, the default reports
directory, and the `--shard` refusal of the commands that pick their own shards or none."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from torchmatrix import cli
from torchmatrix.commands import paths
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.config import load_matrix
from torchmatrix.run.run_request import RunError

MATRIX = (
    '[torch]\nversions = ["system"]\n\n[axes]\nworld_size = [1, 2]\n\n[suites.demo]\npath = "suites/test_demo.py"\n'
)
# What each command needs besides the selection flags to reach its own checks.
REQUIRED = {"merge": ["in", "--out", "merged"], "slurm": ["--gpus-per-node", "2"]}


@pytest.fixture
def config(tmp_path):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "test_demo.py").write_text("def test_x(cell):\n    pass\n")
    (tmp_path / "matrix.toml").write_text(MATRIX)
    return tmp_path / "matrix.toml"


def test_the_parser_lists_every_registered_command_in_order_each_with_its_handler():
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(subparsers.choices) == [command.NAME for command in cli.COMMANDS]
    for command in cli.COMMANDS:
        assert subparsers.choices[command.NAME].get_default("handler") is command.run


SHARD_REFUSING = [command for command in cli.COMMANDS if hasattr(command, "SHARD_REFUSAL")]


def test_every_command_with_selection_flags_but_run_and_list_refuses_shard():
    assert sorted(command.NAME for command in SHARD_REFUSING) == [
        "bisect",
        "github-matrix",
        "merge",
        "sensitivity",
        "slurm",
    ]


@pytest.mark.parametrize("command", SHARD_REFUSING, ids=lambda command: command.NAME)
def test_shard_is_refused_in_the_commands_own_line(command, config, capsys):
    if command.NAME == "bisect" and importlib.util.find_spec("nox") is None:
        pytest.skip("bisect refuses a missing nox first")
    argv = [command.NAME, "--config", str(config), "--shard", "1/2", *REQUIRED.get(command.NAME, [])]
    assert cli.main(argv) == ExitCode.USAGE
    assert capsys.readouterr().err == f"torchmatrix: error: {command.SHARD_REFUSAL}\n"


def test_list_takes_a_shard(config, capsys):
    assert cli.main(["list", "--config", str(config), "--shard", "2/2"]) == ExitCode.PASSED
    assert capsys.readouterr().out == "ws2\n"


def test_a_run_directory_is_a_directory(tmp_path):
    assert paths.run_directory(tmp_path) == tmp_path
    (tmp_path / "file").write_text("")
    with pytest.raises(RunError) as refused:
        paths.run_directory(tmp_path / "file")
    assert (
        str(refused.value)
        == f"{tmp_path / 'file'} is not a run directory; pass one under reports/, e.g. reports/latest"
    )
    with pytest.raises(RunError, match=r"^--from \S+ is not a run directory"):
        paths.run_directory(tmp_path / "missing", "--from")


def test_the_reports_directory_defaults_to_reports_next_to_the_matrix(config, tmp_path, monkeypatch):
    matrix = load_matrix(str(config))
    assert paths.reports_directory(None, matrix) == config.parent / "reports"
    monkeypatch.chdir(tmp_path)
    assert paths.reports_directory("elsewhere", matrix) == tmp_path.resolve() / "elsewhere"
