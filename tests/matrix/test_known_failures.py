"""`[[known_failure]]`: which cells and tests an entry covers, and one line for each malformed entry."""

from __future__ import annotations

import pytest

from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.config import ConfigError, load_matrix
from torchmatrix.matrix.known_failures import expected_failures

MATRIX = """
[torch]
versions = ["2.13.0", "2.14.1"]

[axes]
world_size = [1, 4]
compile = ["none", "inductor"]

[suites.grad_ckpt]
[suites.resume]
"""

ENTRY = """
[[known_failure]]
test = ["grad_ckpt::test_loss*", "grad_ckpt::test_buffers"]
compile = "inductor"
world_size = [4]
torch = ["2.13.0"]
reason = "pytorch#1: compiled blocks at a second length"
"""


def load(tmp_path, text: str):
    path = tmp_path / "matrix.toml"
    path.write_text(text)
    return load_matrix(path)


def test_an_entry_covers_its_tests_in_matching_cells_on_its_versions(tmp_path):
    entries = load(tmp_path, MATRIX + ENTRY).known_failures
    covered = Cell({"world_size": 4, "compile": "inductor"})
    assert expected_failures(entries, "grad_ckpt", covered, "2.13.0") == (
        ("test_loss*", "pytorch#1: compiled blocks at a second length"),
        ("test_buffers", "pytorch#1: compiled blocks at a second length"),
    )
    assert expected_failures(entries, "grad_ckpt", covered, "2.14.1") == (), "another version"
    assert len(expected_failures(entries, "grad_ckpt", covered, "system", "2.13.0")) == 2, "the torch installed here"
    assert expected_failures(entries, "grad_ckpt", covered, "system", "2.14.1") == (), "another torch installed here"
    assert expected_failures(entries, "resume", covered, "2.13.0") == (), "another suite"
    assert expected_failures(entries, "grad_ckpt", Cell({"world_size": 4, "compile": "none"}), "2.13.0") == ()
    assert expected_failures(entries, "grad_ckpt", Cell({"world_size": 1, "compile": "inductor"}), "2.13.0") == ()


@pytest.mark.parametrize(
    "entry, expected",
    [
        ('[[known_failure]]\ntest = "grad_ckpt"\nreason = "x"\n', "known_failure[0].test: missing or not 'SUITE::TEST'"),
        ('[[known_failure]]\ntest = "nosuch::*"\nreason = "x"\n', "'nosuch::*' names no suite of this matrix; use one of: grad_ckpt, resume"),
        ('[[known_failure]]\ntest = ["resume::*", "parallel_equivalence::*"]\nreason = "x"\n', "'parallel_equivalence::*' names the built-in suite parallel_equivalence, which this matrix does not run; drop 'parallel_equivalence::*' from this entry (the whole entry if it names no other test), or add [suites.parallel_equivalence]"),
        ('[[known_failure]]\ntest = "resume::*"\n', "known_failure[0].reason: missing; say which upstream bug"),
        ('[[known_failure]]\ntest = "resume::*"\nreason = "x"\nmesh = "hsdp"\n', "known_failure[0].mesh: is not an axis"),
        ('[[known_failure]]\ntest = "resume::*"\nreason = "x"\ntorch = ["2.15.0"]\n', "'2.15.0' is not in [torch].versions"),
        ('[[known_failure]]\ntest = "resume::*"\nreason = "x"\ntorch = "2.13.0"\n', "known_failure[0].torch: must be a list"),
    ],
)  # fmt: skip
def test_a_malformed_entry_is_one_line_naming_the_key_and_the_fix(tmp_path, entry, expected):
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, MATRIX + entry)
    assert expected in str(raised.value)
    assert "\n" not in str(raised.value)
