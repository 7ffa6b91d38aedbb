"""Text from a run (failure messages, test and cell ids) that reaches generated code or a shell:
repro.py holds it only as a literal's value, and every command shown to a user is quoted, so a
hostile message or id stays data. Each check is also run on the way it used to be done, which it
must reject."""

from __future__ import annotations

import ast
import subprocess

import pytest

from torchmatrix.reports.records import TestRecord
from torchmatrix.reports.reproducible import failure_id, repro_command
from torchmatrix.repro.command import script_text, source_literal
from torchmatrix.status import Confirmation

HOSTILE_MESSAGES = [
    r"FileNotFoundError: C:\Users\ci\AppData\Local\Temp\ckpt\.metadata",
    'AssertionError: """\n__import__("os").system("touch PWNED")\n"""',
    "x''' + __import__('os').system('touch PWNED') + r'''",
    "ends with a backslash \\",
]
HOSTILE_IDS = ["test_x[it's]", "test_a'$(touch PWNED)'b", "test_$(touch PWNED)", 'test_"`touch PWNED`"']


def _record(message: str = "boom", test: str = "test_x") -> TestRecord:
    return TestRecord(
        "2.13.0", "ws1", "demo", test, "failed", 1.0, message=message, confirmation=Confirmation.FAILS_ALONE
    )


def _check() -> dict:
    return {"suite": "demo", "test": "test_x", "suite_file": "suites/test_demo.py", "cell_id": "ws1", "cell": {},
            "world_size": 1, "device": "cpu", "timeout": 60, "options": {}, "components": {}}  # fmt: skip


def _calls(tree: ast.AST) -> set[str]:
    """The names every call in `tree` calls (`os.system(...)` -> system)."""
    return {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    }


def holds_as_data(script: str, message: str) -> bool:
    """The script parses, FAILURE's root cause is `message` exactly, and the message added no code."""
    try:
        tree = ast.parse(script)
    except SyntaxError:
        return False
    values = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    if "FAILURE" not in values or ast.literal_eval(values["FAILURE"]).get("root_cause") != message:
        return False
    return "system" not in _calls(tree)


def docstring_script(message: str) -> str:
    """The known-bad way: the message pasted into the script's docstring."""
    return f'"""Root cause: {message}\n"""\n\nFAILURE = {{"root_cause": "?"}}\n'


@pytest.mark.parametrize("message", HOSTILE_MESSAGES)
def test_a_hostile_message_stays_data_in_repro_py(message):
    script = script_text(_check(), {}, _record(message), "2.13.0+cpu")
    assert holds_as_data(script, message)
    assert message not in ast.get_docstring(ast.parse(script))


@pytest.mark.parametrize("message", HOSTILE_MESSAGES[:3])
def test_the_check_rejects_a_message_pasted_into_the_docstring(message):
    assert not holds_as_data(docstring_script(message), message)


@pytest.mark.parametrize("text", [*HOSTILE_MESSAGES, "x = 1  # \\''", "ends with a quote '", "r'''"])
def test_inlined_sources_read_back_exactly(text):
    assert ast.literal_eval(source_literal(text)) == text


def pasted_arguments(command: str, cwd) -> list[str]:
    """What a POSIX shell hands `torchmatrix repro` when a user pastes `command` (printf stands in for it)."""
    assert command.startswith("torchmatrix repro ")
    done = subprocess.run(
        ["sh", "-c", "printf '%s\\n' " + command.removeprefix("torchmatrix repro ")],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    return done.stdout.splitlines() if done.returncode == 0 else [f"exit {done.returncode}: {done.stderr}"]


@pytest.mark.parametrize("test", HOSTILE_IDS)
def test_a_hostile_id_pastes_as_one_argument_and_runs_nothing(tmp_path, test):
    record = _record(test=test)
    assert pasted_arguments(repro_command("run-1", record), tmp_path) == ["reports/run-1", failure_id(record)]
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("test", HOSTILE_IDS[:2])
def test_the_check_rejects_an_id_in_bare_single_quotes(tmp_path, test):
    record = _record(test=test)
    old = f"torchmatrix repro reports/run-1 '{failure_id(record)}'"
    assert pasted_arguments(old, tmp_path) != ["reports/run-1", failure_id(record)] or (tmp_path / "PWNED").exists()
