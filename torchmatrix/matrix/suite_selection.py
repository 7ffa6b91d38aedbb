"""Choosing which suites and tests a run covers: `--suite NAME` and `--test SUITE::TEST[PARAMS]`.

Both are checked before anything runs: a suite the matrix lacks, or a test function its file does
not define (read with `ast`, without importing torch), is a one-line error blaming the filter. A
parametrization (`[dropout=0.0]`) is only known once pytest collects, so the plugin reports one
that matches nothing as an error of the cell, naming the ones that exist.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from torchmatrix.matrix.builtin_suites import builtin_suite_path
from torchmatrix.matrix.selection import SelectionError

EXAMPLE_SUITE = "grad_ckpt"
"""The built-in suite whose tests the `--help` examples name."""


def split_test(text: str) -> tuple[str, str]:
    """`SUITE::TEST[PARAMS]` as (suite, test); raise SelectionError saying how to write it."""
    suite, separator, test = text.partition("::")
    if not separator or not suite or not test:
        raise SelectionError(f"--test {text!r}: write it as SUITE::TEST, e.g. --test {example_test()}")
    return suite, test


def function_of(test: str) -> str:
    """The test function a test name belongs to: `test_x[dropout=0.0]` -> `test_x`."""
    return test.partition("[")[0]


def selects(requested: str, test: str) -> bool:
    """Whether `--test` naming `requested` selects the collected `test`: a function name selects
    every parametrization of it, a name with `[params]` exactly that one."""
    return test == requested or ("[" not in requested and function_of(test) == requested)


def unmatched_tests(requested: Sequence[str], collected: Sequence[str]) -> list[str]:
    """The requested names that select none of the `collected` test names."""
    return [name for name in requested if not any(selects(name, test) for test in collected)]


def unmatched_test_message(suite: str, requested: str, collected: Sequence[str]) -> str:
    """One line for a `--test` name that selects none of a run's collected tests, naming the ones
    it has (the parametrizations of the function it names, where it has that function)."""
    function = function_of(requested)
    same_function = [test for test in collected if function_of(test) == function]
    if same_function:
        there = f"{function} runs here as {', '.join(same_function)}; name one of them, or {function} for all"
    elif collected:
        there = f"its tests here: {', '.join(dict.fromkeys(map(function_of, collected)))}"
    else:
        there = "it collected no test here"
    return f"--test {suite}::{requested} matches no test of suite {suite} in this cell; {there}"


def defined_tests(path: Path) -> set[str] | None:
    """The test functions pytest collects from a suite file (`test*` functions, methods of `Test*`
    classes, `test*` names imported or assigned), read without importing it; None when the file
    cannot tell (unreadable, not Python, or a `*` import)."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names.update(n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
        elif isinstance(node, ast.ImportFrom):
            if any(alias.name == "*" for alias in node.names):
                return None
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
    return {name for name in names if name.startswith("test")}


@dataclass(frozen=True)
class SuiteSelection:
    """What `--suite` and `--test` asked for; empty, every suite runs whole.

    A suite `--suite` names runs whole; a suite only `--test` names runs the tests it names.
    """

    suites: tuple[str, ...] = ()
    tests: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.suites or self.tests)

    def narrowed(self) -> dict[str, tuple[str, ...]]:
        """Suite -> the tests `--test` keeps of it, for the suites it narrows."""
        kept: dict[str, tuple[str, ...]] = {}
        for text in self.tests:
            suite, test = split_test(text)
            kept[suite] = (*kept.get(suite, ()), test)
        return kept

    def choose(self, suites: Mapping, root: Path) -> dict:
        """The suites of `suites` (name -> Suite, paths relative to `root`) this selection runs;
        raise SelectionError naming the first suite or test it asks for that does not exist."""
        if not self:
            return dict(suites)
        narrowed = self.narrowed()
        for name in [*self.suites, *narrowed]:
            if name not in suites:
                flag = f"--suite {name}" if name in self.suites else f"--test {name}::{narrowed[name][0]}"
                raise SelectionError(f"{flag}: no suite {name!r} in this run; its suites: {', '.join(suites)}")
        for name, tests in narrowed.items():
            if name in self.suites:
                raise SelectionError(
                    f"--test {name}::{tests[0]} narrows suite {name}, which --suite {name} asks for whole; pass one of them"
                )
            _check_functions(name, Path(root, suites[name].path), tests)
        return {name: suite for name, suite in suites.items() if name in self.suites or name in narrowed}


def _check_functions(suite: str, path: Path, tests: Sequence[str]) -> None:
    """Raise SelectionError for the first test whose function `path` does not define."""
    defined = defined_tests(path)
    if defined is None:
        return
    for test in tests:
        if function_of(test) not in defined:
            raise SelectionError(
                f"--test {suite}::{test} matches no test of suite {suite} ({path.name}); its tests: {', '.join(sorted(defined))}"
            )


def example_test() -> str:
    """A real `SUITE::TEST` of a built-in suite, for the help text: its shortest test name."""
    defined = [name for name in defined_tests(builtin_suite_path(EXAMPLE_SUITE)) or () if name.startswith("test_")]
    return f"{EXAMPLE_SUITE}::{min(defined, key=lambda name: (len(name), name), default='TEST')}"
