"""`UserError`: every error the user can fix derives from it, the CLI and the nox sessions catch it
once (one line, exit 2), and no command spells an exit code as a number."""

from __future__ import annotations

import ast
import importlib
import pkgutil

import pytest

import torchmatrix
from torchmatrix import cli, sessions
from torchmatrix.commands import list_cells
from torchmatrix.exit_codes import ExitCode
from torchmatrix.user_error import UserError

from helpers.checkout import REPO

# Exceptions that never reach the user as such, each with why.
INTERNAL = {
    "torchmatrix.components.optimizer_implementations.UnavailableImplementation": "the cell's tests skip with its reason",
    "torchmatrix.components.checkpoint_modes.UnavailableCheckpointMode": "the cell's resume tests skip with its reason",
    "torchmatrix.env.devices.ProbeError": "the runner records the failed probe in the reports",
    "torchmatrix.env.envdir_lock.EnvdirUnlockable": "a warning: the run goes on without the lock",
    "torchmatrix.messages.group_plan.GroupPlanError": "the runner wrote the file; its pytest process errors",
    "torchmatrix.messages.events.EventLogError": "a truncated event line; the reader stops there",
    "torchmatrix.ranks.pool.RankFailure": "a rank's failure, reported as the test's",
    "torchmatrix.repro.harness.RankFailure": "inside a reproducer, which runs without torchmatrix",
}
NO_LITERAL_EXIT_CODES = [
    "torchmatrix/cli.py",
    "torchmatrix/sessions.py",
    "torchmatrix/run/runner.py",
    "torchmatrix/sensitivity/command.py",
] + sorted(str(path.relative_to(REPO)) for path in (REPO / "torchmatrix" / "commands").glob("*.py"))


def exception_classes() -> dict[str, type]:
    """Every exception class defined in a torchmatrix module, by its qualified name."""
    found = {}
    for info in pkgutil.walk_packages(torchmatrix.__path__, "torchmatrix."):
        if info.name == "torchmatrix.__main__":
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == info.name:
                found[f"{info.name}.{value.__qualname__}"] = value
    return found


def test_every_exception_is_a_user_error_or_listed_as_internal():
    classes = exception_classes()
    undecided = [name for name, cls in classes.items() if not issubclass(cls, UserError) and name not in INTERNAL]
    assert undecided == [], "derive from UserError (one line, exit 2), or list it in INTERNAL with why"
    assert set(INTERNAL) <= set(classes), "INTERNAL names a class that is gone"
    assert len(classes) - len(INTERNAL) >= 15


def test_a_new_user_error_reaches_the_user_as_one_line_and_exit_2(monkeypatch, capsys):
    class NewRefusal(UserError):
        """One that no handler names."""

    def refuse(path):
        raise NewRefusal("matrix.toml: [axes] x: what to change")

    monkeypatch.setattr(list_cells, "load_matrix", refuse)
    assert cli.main(["list"]) == ExitCode.USAGE
    assert capsys.readouterr().err == "torchmatrix: error: matrix.toml: [axes] x: what to change\n"


def test_an_error_outside_the_base_is_not_swallowed(monkeypatch):
    def crash(path):
        raise LookupError("a bug, not the user's")

    monkeypatch.setattr(list_cells, "load_matrix", crash)
    with pytest.raises(LookupError):
        cli.main(["list"])


def test_the_sessions_end_nox_with_the_line_and_the_code(capsys):
    with pytest.raises(SystemExit) as ended, sessions.exit_on_user_error():
        raise UserError("TORCHMATRIX_RUN_ID: what to change")
    assert ended.value.code == ExitCode.USAGE
    assert capsys.readouterr().err == "torchmatrix: error: TORCHMATRIX_RUN_ID: what to change\n"


EXIT_STATEMENTS = (ast.Return, ast.Raise, ast.Compare, ast.Assign)


def literal_exit_codes(source: str) -> list[int]:
    """Lines whose return, raise, comparison or assignment spells 2 or 130 (not as an index): exit
    codes that should be `ExitCode` members."""
    tree = ast.parse(source)
    indices = {id(node.slice) for node in ast.walk(tree) if isinstance(node, ast.Subscript)}
    return sorted(
        statement.lineno
        for statement in ast.walk(tree)
        if isinstance(statement, EXIT_STATEMENTS)
        for node in ast.walk(statement)
        if isinstance(node, ast.Constant)
        and type(node.value) is int
        and node.value in (2, 130)
        and id(node) not in indices
    )


@pytest.mark.parametrize("path", NO_LITERAL_EXIT_CODES)
def test_no_command_spells_an_exit_code_as_a_number(path):
    assert literal_exit_codes((REPO / path).read_text()) == [], f"{path}: use ExitCode"


def test_a_literal_exit_code_is_found():
    source = "def main():\n    if interrupted:\n        return 130\n    raise SystemExit(2)\nUSAGE_EXIT = 2\nb = a[2]\n"
    assert literal_exit_codes(source) == [3, 4, 5]
