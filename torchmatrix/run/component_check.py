"""Check matrix.toml's `[components]` against torchmatrix.components.protocol before any cell runs.

A wrong import path, a factory that cannot take the suites' arguments or an optimizer factory
that returns something the suites cannot use would otherwise fail every cell, one traceback
each, minutes in. The imports run in a child interpreter of the torch environment, so the runner
never imports torch or the user's code itself; that child answers the torch probe too
(torchmatrix.env.devices), and a run forks it from its preloaded interpreter
(torchmatrix.forks.preloaded_forks), which has imported torch already for the pytest processes. A
component whose package this environment lacks is no problem here but a warning: its cells
error, or skip where `[optional]` allows (torchmatrix.components.optional).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.components.calling import accepts, build_optimizer, call_accepting, is_bound_checkpointer
from torchmatrix.components.optimizer_like import optimizer_like_problems
from torchmatrix.components.optional import is_optional_here, needs_package, warning_line
from torchmatrix.components.protocol import (
    ALWAYS,
    COMPONENTS,
    OPTIONAL,
    Argument,
    Component,
    component_for,
    parameters_text,
    required_names,
)
from torchmatrix.env.component_requirements import uninstalled_here
from torchmatrix.env.devices import Environment, ProbeError, environment_of, torch_facts
from torchmatrix.forks.preloaded_forks import PreloadedForks, run_to_end
from torchmatrix.matrix.config import Matrix
from torchmatrix.messages.compile_keys import build_facts
from torchmatrix.run.import_path import user_code_environment

CHILD = "from torchmatrix.run.component_check import main; main()"
ANSWER_NAME = "answer.json"
MAX_PARAMETERS_TEXT = 120
"""Characters of a factory's parameter names a signature problem quotes (its annotations can run to a thousand)."""


@dataclass
class ComponentCheck:
    """What the check found: `problems` stop the run (exit 2); `warnings` name components whose
    package is missing here, and whether their cells will error or skip. One line each,
    `<matrix.toml>: components.<name>: ...`."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    environment: Environment | ProbeError | None = field(default=None, compare=False)
    """What the child found of torch, as devices.probe would have; None where it gave no answer."""
    build: dict | None = field(default=None, compare=False)
    """The compile store key's facts the child's torch build, compiler and sources give
    (compile_keys.build_facts), for the ETA; None where it could not say."""


def check_components(
    matrix: Matrix,
    torch_version: str,
    python: str = sys.executable,
    timeout: float = 300.0,
    *,
    env: dict | None = None,
    forks: PreloadedForks | None = None,
    suite_files: Iterable[Path] = (),
) -> ComponentCheck:
    """Check every component in a child interpreter of `python`, the environment of `torch_version`,
    forked from `forks` where it can be; the child answers the torch probe even for a matrix without
    components, and the compile key's facts of `suite_files` and the components.

    Components a registered suite needs but `[components]` lacks are problems too; the import
    checks run with the working directory the suites run in (the matrix file's directory) and
    `env` (by default the suites' variables, torchmatrix.run.import_path).
    """
    needed = required_names(
        [Path(suite.path).stem.removeprefix("test_") for suite in matrix.suites.values()],
        [str(value) for value in matrix.axes.get("optimizer", ())],
    )
    where = str(matrix.path)
    check = ComponentCheck(
        problems=[
            f'{where}: components.{key}: missing, and suite {" and ".join(users)} calls it; add {key} = "package.module:attribute"'
            for key, users in needed.items()
            if key not in matrix.components
        ]
    )
    with tempfile.TemporaryDirectory(prefix="torchmatrix-component-check-") as directory:
        answer, components, suites, output, errors = (
            Path(directory) / name
            for name in (ANSWER_NAME, "components.json", "suite-files.json", "output.log", "errors.log")
        )
        file_writes.write_text(components, json.dumps(matrix.components))
        file_writes.write_text(suites, json.dumps([str(path) for path in suite_files]))
        try:
            code = run_to_end(
                [python, "-c", CHILD, str(answer), str(components), str(suites)],
                cwd=matrix.root,
                env=env if env is not None else user_code_environment(matrix.root, os.environ),
                log=output,
                errors=errors,
                timeout=timeout,
                forks=forks,
            )
        except subprocess.TimeoutExpired:
            check.problems.append(
                f"{where}: components: importing them took over {timeout:.0f}s; check what their modules do at import"
            )
            return check
        said = errors.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        found = _read_answer(answer)
    if found is None:
        last = (said or [f"exit code {code}, no answer"])[-1]
        check.problems.append(f"{where}: components: the check could not run with {python}: {last}")
        return check
    try:
        check.environment = environment_of(found["torch"], python)
    except ProbeError as error:
        check.environment = error
    check.build = found.get("build")
    check.problems += [f"{where}: components.{key}: {problem}" for key, problem in found["problems"]]
    uninstalled = uninstalled_here()
    missing = {key: f"{key} needs {reason}" for key, reason in uninstalled.items() if key in matrix.components}
    missing.update({key: needs for key, needs in found["missing"] if key not in missing})
    device_type = "cuda" if found["torch"].get("gpu_count") else "cpu"
    check.warnings += [
        f"{where}: components.{key}: "
        + warning_line(
            key, needs, device_type, optional=is_optional_here(matrix.optional, key, device_type, torch_version)
        )
        for key, needs in missing.items()
    ]
    return check


def _read_answer(path: Path) -> dict | None:
    """The child's answer from the file the parent named (what user code prints goes elsewhere);
    None when the child never wrote it (it died, or user code exited at import)."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def problems_of(key: str, import_path: str) -> tuple[list[str], str | None]:
    """What is wrong with one component, in this interpreter: `<problem>; <fix>` lines, and what its
    module needs that this environment lacks (`key = path needs 'pkg', ...`), if that is why it fails to import."""
    module_name, _, attribute = import_path.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and (module_name == error.name or module_name.startswith(error.name + ".")):
            return [
                f"no module {error.name!r} to import {import_path!r} from; fix the module path, or make its package importable from {Path.cwd()} (install it or set PYTHONPATH)"
            ], None
        return [], needs_package(key, import_path, error.name or "?")
    except Exception as error:
        return [f"importing {module_name!r} raised {type(error).__name__}: {error}; fix the module so it imports"], None
    for part in attribute.split("."):
        if not hasattr(obj, part):
            names = [name for name in dir(obj) if not name.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "name an attribute it has"
            return [f"{getattr(obj, '__name__', module_name)!r} has no attribute {part!r}; {hint}"], None
        obj = getattr(obj, part)
    component = component_for(key)
    if component is None:
        return [], None
    if component.name in ("checkpointer", "checkpointer_async"):  # the asynchronous one comes in the same two forms
        component = checkpointer_form(obj)
    problems = signature_problems(component, obj, key)
    if not problems and component.name == "optimizer_<value>":
        problems = returned_optimizer_problems(obj)
    if not problems and component.name == "scheduler":
        problems = returned_scheduler_problems(obj)
    return problems, None


def checkpointer_form(obj) -> Component:
    """The protocol entry of the checkpointer form `obj` has: bound (a class or factory built once
    with the training objects, its signature names `model`) or per-call (a zero-argument factory)."""
    form = "bound" if is_bound_checkpointer(obj) else "per-call"
    return next(entry for entry in COMPONENTS if entry.name == "checkpointer" and entry.form == form)


SCHEDULER_METHODS = ("step", "state_dict", "load_state_dict")


def returned_scheduler_problems(factory) -> list[str]:
    """Build the scheduler over an optimizer of one dummy parameter and check what comes back has
    what the suites call; a factory that raises on the dummy is left to the cells, which say why."""
    import torch

    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2, bias=False).parameters(), lr=1e-3)
    try:
        scheduler = call_accepting(factory, optimizer, warmup_steps=2, total_steps=4, cell={})
    except Exception:
        return []
    missing = [name for name in SCHEDULER_METHODS if not callable(getattr(scheduler, name, None))]
    if not missing:
        return []
    return [
        f"what it returns ({type(scheduler).__name__}) lacks {', '.join(missing)} (the suites step, save and load the "
        f"scheduler); return a torch LR scheduler, or an object with {', '.join(SCHEDULER_METHODS)}"
    ]


def returned_optimizer_problems(factory) -> list[str]:
    """Build the optimizer on one dummy parameter and ask whether the suites can use what comes
    back; a factory that raises on the dummy is left to the cells, which say why."""
    import torch

    try:
        optimizer = build_optimizer(factory, torch.nn.Linear(2, 2, bias=False), lr=1e-3)
    except Exception:
        return []
    return optimizer_like_problems(optimizer)


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
        if target is None and member.optional:
            continue
        if target is None:
            problems.append(f"{obj.__qualname__} has no method {member.name!r}; the suites call {call}")
            continue
        plain_method = member.on_instance and inspect.isfunction(inspect.getattr_static(obj, member.name))
        problems += _call_problems(target, member.arguments, call, leading=1 if plain_method else 0)
    return problems


def _call_problems(target, arguments: tuple[Argument, ...], call: str, leading: int = 0) -> list[str]:
    """Bind each call the suites make (with and without the arguments only some of them pass) to
    `target`'s signature; an optional argument the signature names is passed in every call, so it
    may be required. `leading` placeholders stand for `self` of a method read off its class."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []  # no signature to read (some builtins): the call itself will tell
    always = [a for a in arguments if a.passed == ALWAYS]
    passed = [a for a in arguments if a.passed != OPTIONAL]
    accepted_optional = [a for a in arguments if a.passed == OPTIONAL and accepts(target, a.name)]
    for arguments_passed in (always + accepted_optional, passed + accepted_optional):
        positional = [None] * (leading + sum(a.positional for a in arguments_passed))
        keywords = {a.name: None for a in arguments_passed if not a.positional}
        try:
            signature.bind(*positional, **keywords)
        except TypeError as error:
            return [
                f"its signature ({parameter_names(signature)}) cannot take {parameters_text(arguments_passed)} ({error}); make it accept {call}"
            ]
    return []


def parameter_names(signature: inspect.Signature) -> str:
    """The parameters as `a, b, *, c, **kw`, without annotations or defaults, cut at MAX_PARAMETERS_TEXT characters."""
    names, keyword_only_marked = [], False
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            keyword_only_marked = True
            names.append(f"*{parameter.name}")
        elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
            names.append(f"**{parameter.name}")
        else:
            if parameter.kind is inspect.Parameter.KEYWORD_ONLY and not keyword_only_marked:
                keyword_only_marked = True
                names.append("*")
            names.append(parameter.name)
    text = ", ".join(names)
    return text if len(text) <= MAX_PARAMETERS_TEXT else text[: MAX_PARAMETERS_TEXT - 1] + "…"


def main() -> None:
    """Child side: read {key: import path} from the file the parent names second (argv[2]) and the
    suites' files from the third, write as JSON to the file it names first (argv[1]) this environment's
    torch facts (first, before any user code runs), [[key, problem], ...], [[key, what its module
    needs], ...] and the compile key's build facts. Not on stdout: the user's modules may print there,
    at import or at exit.

    sys.path is the suites' (torchmatrix.run.import_path): the matrix directory first.
    """
    facts = torch_facts()
    components = json.loads(Path(sys.argv[2]).read_text(encoding="utf-8"))
    problems, missing = [], []
    for key, path in components.items():
        found, needs = problems_of(key, path)
        problems += [[key, problem] for problem in found]
        if needs:
            missing.append([key, needs])
    try:  # what the ETA guesses of the compile store with: never a reason to stop
        build = build_facts(components=components, suite_files=map(Path, json.loads(Path(sys.argv[3]).read_text())))
    except Exception:
        build = None
    answer = {"torch": facts, "problems": problems, "missing": missing, "build": build}
    file_writes.write_text(Path(sys.argv[1]), json.dumps(answer))
