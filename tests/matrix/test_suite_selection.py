"""`--suite` and `--test`: what they select, and the one-line errors for what they name but cannot find."""

from __future__ import annotations

import importlib

import pytest

from torchmatrix.cli import build_parser
from torchmatrix.cli_reference import markdown_reference
from torchmatrix.matrix.builtin_suites import BUILTIN_SUITES, builtin_suite_path
from torchmatrix.matrix.config import Suite
from torchmatrix.matrix.selection import SelectionError
from torchmatrix.matrix.suite_selection import (
    SuiteSelection,
    defined_tests,
    example_test,
    selects,
    split_test,
    unmatched_test_message,
    unmatched_tests,
)

SUITE_FILE = """
import pytest
from .shared import test_imported, helper
from .shared import test_original as test_renamed

@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_gradients(cell, dropout):
    pass

def test_buffers(cell):
    pass

class TestTogether:
    def test_in_class(self, cell):
        pass

class Helpers:
    def test_not_collected(self):
        pass

test_assigned = test_buffers

def build():
    pass
"""


@pytest.fixture
def suites(tmp_path):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "test_a.py").write_text(SUITE_FILE)
    (tmp_path / "suites" / "test_b.py").write_text("def test_b(cell):\n    pass\n")
    return {
        "alpha": Suite("alpha", "suites/test_a.py", 60, ()),
        "beta": Suite("beta", "suites/test_b.py", 60, ()),
    }


def test_a_function_name_selects_every_parametrization_and_a_parametrization_only_itself():
    assert selects("test_gradients", "test_gradients[dropout=0.0]")
    assert selects("test_gradients", "test_gradients[dropout=0.1]")
    assert selects("test_gradients", "test_gradients")
    assert selects("test_gradients[dropout=0.0]", "test_gradients[dropout=0.0]")
    assert not selects("test_gradients[dropout=0.0]", "test_gradients[dropout=0.1]")
    assert not selects("test_gradients", "test_gradients_twice")
    assert not selects("test_grad", "test_gradients[dropout=0.0]"), "a prefix is not a function name"


def test_the_suite_file_is_read_for_the_tests_pytest_would_collect(suites, tmp_path):
    found = defined_tests(tmp_path / suites["alpha"].path)
    assert found == {
        "test_gradients",
        "test_buffers",
        "test_in_class",
        "test_imported",
        "test_renamed",
        "test_assigned",
    }


def test_a_file_that_cannot_tell_its_tests_is_not_judged(tmp_path):
    (tmp_path / "star.py").write_text("from .shared import *\n")
    (tmp_path / "broken.py").write_text("def test_x(:\n")
    assert defined_tests(tmp_path / "star.py") is None
    assert defined_tests(tmp_path / "broken.py") is None
    assert defined_tests(tmp_path / "missing.py") is None
    chosen = SuiteSelection(tests=("star::test_anything",)).choose({"star": Suite("star", "star.py", 60, ())}, tmp_path)
    assert list(chosen) == ["star"], "left to collection, which reports a name that matches nothing"


def test_no_selection_runs_every_suite_and_suite_runs_only_the_named(suites, tmp_path):
    assert SuiteSelection().choose(suites, tmp_path) == suites
    assert list(SuiteSelection(suites=("beta",)).choose(suites, tmp_path)) == ["beta"]
    tests = SuiteSelection(tests=("alpha::test_gradients", "alpha::test_buffers[x=1]"))
    assert list(tests.choose(suites, tmp_path)) == ["alpha"]
    assert tests.narrowed() == {"alpha": ("test_gradients", "test_buffers[x=1]")}
    both = SuiteSelection(suites=("beta",), tests=("alpha::test_buffers",))
    assert list(both.choose(suites, tmp_path)) == ["alpha", "beta"]
    assert both.narrowed() == {"alpha": ("test_buffers",)}, "beta runs whole"


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        (SuiteSelection(suites=("gamma",)), "--suite gamma: no suite 'gamma' in this run; its suites: alpha, beta"),
        (
            SuiteSelection(tests=("gamma::test_x",)),
            "--test gamma::test_x: no suite 'gamma' in this run; its suites: alpha, beta",
        ),
        (
            SuiteSelection(tests=("alpha::test_buffers", "alpha::test_grads_match")),
            "--test alpha::test_grads_match matches no test of suite alpha (test_a.py); its tests: "
            "test_assigned, test_buffers, test_gradients, test_imported, test_in_class, test_renamed",
        ),
        (
            SuiteSelection(tests=("alpha::test_not_collected[a=1]",)),
            "--test alpha::test_not_collected[a=1] matches no test of suite alpha (test_a.py)",
        ),
        (
            SuiteSelection(suites=("alpha",), tests=("alpha::test_buffers",)),
            "--test alpha::test_buffers narrows suite alpha, which --suite alpha asks for whole; pass one of them",
        ),
    ],
)
def test_a_selection_naming_what_is_not_there_is_one_line_blaming_the_filter(suites, tmp_path, selection, expected):
    with pytest.raises(SelectionError) as raised:
        selection.choose(suites, tmp_path)
    assert str(raised.value).startswith(expected)
    assert "\n" not in str(raised.value)


def test_a_malformed_test_says_how_to_write_it():
    assert split_test("alpha::test_x[a=1]") == ("alpha", "test_x[a=1]")
    for text in ("test_x", "alpha::", "::test_x"):
        with pytest.raises(SelectionError, match="write it as SUITE::TEST, e.g. --test grad_ckpt::test_"):
            split_test(text)


def test_a_name_that_matches_no_collected_test_names_what_the_cell_has():
    collected = ["test_gradients[dropout=0.0]", "test_gradients[dropout=0.1]", "test_buffers"]
    assert unmatched_tests(["test_gradients", "test_buffers"], collected) == []
    assert unmatched_tests(["test_gradients[dropout=0.5]", "test_buffers[x=1]"], collected) == [
        "test_gradients[dropout=0.5]",
        "test_buffers[x=1]",
    ]
    assert unmatched_test_message("alpha", "test_gradients[dropout=0.5]", collected) == (
        "--test alpha::test_gradients[dropout=0.5] matches no test of suite alpha in this cell; "
        "test_gradients runs here as test_gradients[dropout=0.0], test_gradients[dropout=0.1]; "
        "name one of them, or test_gradients for all"
    )
    assert unmatched_test_message("alpha", "test_gone", collected).endswith(
        "its tests here: test_gradients, test_buffers"
    )
    assert unmatched_test_message("alpha", "test_gone", []).endswith("it collected no test here")


def test_the_help_example_is_a_real_test_of_a_builtin_suite():
    """The example `--help` and the command-line reference show is a function the suite module has
    (imported, so the check does not share the ast reading it comes from)."""
    suite, test = split_test(example_test())
    module = importlib.import_module(f"suites.{BUILTIN_SUITES[suite].file.removesuffix('.py')}")
    assert callable(getattr(module, test)) and test.startswith("test_")
    assert builtin_suite_path(suite).name == BUILTIN_SUITES[suite].file
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    assert f"--test {example_test()};" in next(a.help for a in run._actions if "--test" in a.option_strings)
    assert f"--test {example_test()}" in markdown_reference()
