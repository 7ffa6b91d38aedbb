"""Built-in suites' options: `[suites.<name>.options]` is read into the suite's dataclass at load,
and every key or value it cannot take is one line naming the file, the key and the fix."""

from __future__ import annotations

import dataclasses

import pytest
import tomllib

from torchmatrix.matrix.builtin_suites import BUILTIN_SUITES, options_markdown
from torchmatrix.matrix.config import ConfigError, load_matrix
from torchmatrix.matrix.suite_options import GradCkptOptions, OptionError, ResumeOptions, SuiteOptions, field_docs

from helpers.projects import Project

MATRIX = """
[torch]
versions = ["system"]

[axes]
world_size = [1]

[suites.{suite}]
{path}
[suites.{suite}.options]
{options}
"""

# (suite, options lines, what the one-line error says after `suites.<suite>.options.`)
REFUSED = [
    (
        "resume",
        "resume_stpe = 3",
        "resume_stpe: not an option of this suite; use one of: steps, resume_step, warmup_steps",
    ),
    ("resume", "steps = 6\nresume_step = 5", "resume_step: 5 with steps = 6; need 1 <= resume_step <= steps - 2"),
    ("resume", 'seeding = "alike"', "seeding: 'alike'; write one of 'per_rank', 'replicated'"),
    ("resume", 'batch_keywords = "input_ids"', "batch_keywords: 'input_ids' is not a list of strings"),
    ("resume", 'batch_keywords = ["input ids"]', "batch_keywords: 'input ids' is not a keyword name"),
    ("resume", "loader_batches = 0", "loader_batches: 0; write a number of batches, at least 1"),
    ("resume", "lr = true", "lr: True is not a number"),
    ("grad_ckpt", 'dtype = "float16"', "dtype: 'float16'; write one of 'float32', 'bfloat16'"),
    ("grad_ckpt", 'compute_dtype = "float16"', "compute_dtype: 'float16'; write one of"),
    ("grad_ckpt", "bf16_rtol = 0.1", "bf16_rtol: not an option of this suite; use one of: dtype, compute_dtype"),
    ("grad_ckpt", "micro_batches = 1", "micro_batches: 1; write an integer of at least 2"),
    ("grad_ckpt", "micro_batches = 2.0", "micro_batches: 2.0 is not an integer"),
    ("grad_ckpt", 'ignored_attributes = "log"', "ignored_attributes: 'log' is not a list of strings"),
    ("dtensor_optim", "tensor_parallel_plan = { diagonal = [] }", "tensor_parallel_plan: 'diagonal'; write one of"),
    ("parallel_equivalence", "clip_fraction = 1.5", "clip_fraction: 1.5; write a number between 0 and 1"),
    ("parallel_equivalence", 'reduce_dtype = "int8"', "reduce_dtype: 'int8'; write one of 'float32'"),
    ("cross_version", 'peers = ["2.14.1"]', "peers: not an option of this suite; use one of: steps"),
    ("collectives", "x = 1", "x: not an option of this suite; this suite takes no options"),
]


def write(tmp_path, suite: str, options: str, path: str = "") -> str:
    file = tmp_path / "matrix.toml"
    file.write_text(MATRIX.format(suite=suite, options=options, path=path))
    return str(file)


@pytest.mark.parametrize(("suite", "options", "says"), REFUSED, ids=[f"{s}-{o.split()[0]}" for s, o, _ in REFUSED])
def test_an_option_a_built_in_suite_cannot_take_is_refused_at_load(tmp_path, suite, options, says):
    with pytest.raises(ConfigError) as refused:
        load_matrix(write(tmp_path, suite, options))
    assert str(refused.value).startswith(f"matrix.toml: suites.{suite}.options.{says}")
    assert "\n" not in str(refused.value)


def test_a_suite_of_ones_own_named_like_a_built_in_gets_its_table_unchecked(tmp_path):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "test_resume.py").write_text("def test_x(cell):\n    pass\n")
    matrix = load_matrix(write(tmp_path, "resume", "resume_stpe = 3", 'path = "suites/test_resume.py"'))
    assert matrix.suites["resume"].options == {"resume_stpe": 3}


def test_a_built_in_suite_is_loaded_with_its_dataclass_and_keeps_the_table_as_written(tmp_path):
    """The compile store's key hashes the table as written (an integer stays an integer), so stores stay warm."""
    resume = load_matrix(write(tmp_path, "resume", "lr = 1\nsteps = 8")).suites["resume"]
    assert resume.options == ResumeOptions(lr=1.0) and resume.table == {"lr": 1, "steps": 8}
    assert resume.options.to_table() == {"lr": 1.0}


def test_the_suite_receives_its_dataclass_with_the_table_over_the_defaults():
    options = ResumeOptions.from_table({"steps": 6, "resume_step": 3, "batch_keywords": ["ids"], "lr": 1})
    assert options == ResumeOptions(steps=6, resume_step=3, batch_keywords=("ids",), lr=1.0)
    assert isinstance(options.lr, float)
    with pytest.raises(OptionError):
        GradCkptOptions(micro_batches=1)


def test_every_field_has_a_docstring_and_the_reference_lists_it():
    reference = options_markdown()
    for name, suite in BUILTIN_SUITES.items():
        docs = field_docs(suite.options)
        assert set(docs) == {field.name for field in dataclasses.fields(suite.options)}, name
        assert f"[suites.{name}.options]" in reference
    assert "| `resume_step` | `4` | The step the second run saves at" in reference


USER_SUITE = """
from dataclasses import dataclass

from torchmatrix.testing import SuiteOptions


@dataclass(frozen=True)
class MineOptions(SuiteOptions):
    strict: bool = False
    sizes: tuple[int, ...] = ()
    scales: tuple[float, ...] = ()
    name: str | None = None


OPTIONS = MineOptions


def test_reads_its_options(cell, suite_options):
    assert suite_options == MineOptions(strict=True, sizes=(1, 2, 3), scales=(0.5, 2.0), name="x")
    assert type(suite_options.scales[1]) is float
"""


def test_a_user_suites_options_take_booleans_and_tuples_of_numbers(tmp_path):
    """The OPTIONS dataclass of docs/how-to/write-a-suite.md with a bool and tuple[int, ...] field: a real run passes."""
    project = Project(tmp_path / "project")
    project.write("suites/test_mine.py", USER_SUITE)
    options = 'strict = true\nsizes = [1, 2, 3]\nscales = [0.5, 2]\nname = "x"'
    project.write("matrix.toml", MATRIX.format(suite="mine", path='path = "suites/test_mine.py"', options=options))
    done = project.torchmatrix("run", "--torch", "system", "--run-id", "r")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr


@pytest.mark.parametrize(
    "value, says",
    [
        ("1", "1 is not true or false"),
        ("[1, true]", "[1, True] is not a list of integers"),
        ("[1.5]", "a list of integers"),
    ],
)
def test_a_wrong_value_for_a_bool_or_integer_tuple_names_the_type(value, says):
    @dataclasses.dataclass(frozen=True)
    class Options(SuiteOptions):
        strict: bool = False
        sizes: tuple[int, ...] = ()

    key = "strict" if value == "1" else "sizes"
    with pytest.raises(OptionError) as raised:
        Options.from_table({key: tomllib.loads(f"v = {value}")["v"]})
    assert says in str(raised.value)
