"""Check matrix.toml's `[components]` against torchmatrix.components.protocol before any cell runs.

A wrong import path or a factory that cannot take the suites' arguments would otherwise fail
every cell, one traceback each, minutes in. The imports run in a child interpreter of the torch
environment (like the torch probe of devices.py), so the runner never imports torch or the
user's code itself.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

from torchmatrix.components.protocol import (
    ALWAYS,
    OPTIONAL,
    Argument,
    Component,
    component_for,
    parameters_text,
    required_names,
)
from torchmatrix.matrix.config import Matrix
from torchmatrix.run.import_path import user_code_environment

CHILD = "from torchmatrix.run.component_check import main; main()"


def check_components(matrix: Matrix, python: str = sys.executable, timeout: float = 300.0) -> list[str]:
    """One line per problem, `<matrix.toml>: components.<name>: <problem>; <fix>`; empty when all is well.

    Components a registered suite needs but `[components]` lacks are problems too; the import
    checks run with the working directory the suites run in (the matrix file's directory).
    """
    needed = required_names(
        [Path(suite.path).stem.removeprefix("test_") for suite in matrix.suites.values()],
        [str(value) for value in matrix.axes.get("optimizer", ())],
    )
    where = str(matrix.path)
    problems = [
        f'{where}: components.{key}: missing, and suite {" and ".join(users)} calls it; add {key} = "package.module:attribute"'
        for key, users in needed.items()
        if key not in matrix.components
    ]
    if not matrix.components:
        return problems
    try:
        done = subprocess.run(
            [python, "-c", CHILD],
            input=json.dumps(matrix.components),
            cwd=matrix.root,
            env=user_code_environment(matrix.root, os.environ),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return problems + [
            f"{where}: components: importing them took over {timeout:.0f}s; check what their modules do at import"
        ]
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return problems + [f"{where}: components: the check could not run with {python}: {last}"]
    return problems + [f"{where}: components.{key}: {problem}" for key, problem in json.loads(lines[-1])]


def problems_of(key: str, import_path: str) -> list[str]:
    """What is wrong with one component, in this interpreter: `<problem>; <fix>` lines."""
    module_name, _, attribute = import_path.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and (module_name == error.name or module_name.startswith(error.name + ".")):
            return [
                f"no module {error.name!r} to import {import_path!r} from; fix the module path, or make its package importable from {Path.cwd()} (install it or set PYTHONPATH)"
            ]
        return []  # the module exists but needs a package this environment lacks: its cells say so
    except Exception as error:
        return [f"importing {module_name!r} raised {type(error).__name__}: {error}; fix the module so it imports"]
    for part in attribute.split("."):
        if not hasattr(obj, part):
            names = [name for name in dir(obj) if not name.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "name an attribute it has"
            return [f"{getattr(obj, '__name__', module_name)!r} has no attribute {part!r}; {hint}"]
        obj = getattr(obj, part)
    component = component_for(key)
    if component is None:
        return []
    return signature_problems(component, obj, key)


def signature_problems(component: Component, obj, key: str) -> list[str]:
    """Whether `obj`, the component `key`, accepts every call the suites make to it and has the methods they call."""
    if not callable(obj):
        return [f"{type(obj).__name__} is not callable; point it at a factory taking {component.call_text(key)}"]
    problems = _call_problems(obj, component.arguments, component.call_text(key))
    for member in component.members:
        if member.on_instance and not inspect.isclass(obj):
            continue  # a factory function: what it returns is only known at run time
        call = member.call_text(component.owner_text(member))
        target = getattr(obj, member.name, None)
        if target is None:
            problems.append(f"{obj.__qualname__} has no method {member.name!r}; the suites call {call}")
            continue
        plain_method = member.on_instance and inspect.isfunction(inspect.getattr_static(obj, member.name))
        problems += _call_problems(target, member.arguments, call, leading=1 if plain_method else 0)
    return problems


def _call_problems(target, arguments: tuple[Argument, ...], call: str, leading: int = 0) -> list[str]:
    """Bind each call the suites make (with and without the arguments only some of them pass) to
    `target`'s signature; `leading` placeholders stand for `self` of a method read off its class."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []  # no signature to read (some builtins): the call itself will tell
    takes_any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    always = [a for a in arguments if a.passed == ALWAYS]
    passed = [a for a in arguments if a.passed != OPTIONAL]
    accepted_optional = [
        a for a in arguments if a.passed == OPTIONAL and (takes_any_keyword or a.name in signature.parameters)
    ]
    for arguments_passed in (always, passed, passed + accepted_optional):
        positional = [None] * (leading + sum(a.positional for a in arguments_passed))
        keywords = {a.name: None for a in arguments_passed if not a.positional}
        try:
            signature.bind(*positional, **keywords)
        except TypeError as error:
            return [
                f"its signature {signature} cannot take {parameters_text(arguments_passed)} ({error}); make it accept {call}"
            ]
    return []


def main() -> None:
    """Child side: read {key: import path} on stdin, print [[key, problem], ...] as one JSON line.

    sys.path is the suites' (torchmatrix.run.import_path): the matrix directory first.
    """
    components = json.loads(sys.stdin.read())
    print(json.dumps([[key, problem] for key, path in components.items() for problem in problems_of(key, path)]))
