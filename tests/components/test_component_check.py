"""The pre-run component check: a user's components in a temporary package, checked against the
protocol in a child interpreter, each problem one line naming matrix.toml, the key and the fix."""

from __future__ import annotations

import pytest

from torchmatrix.components import protocol
from torchmatrix.matrix.config import load_matrix
from torchmatrix.run.component_check import check_components

from conftest import REPO, Project, matrix_toml


def resume_matrix(components: dict[str, str]) -> str:
    """One resume cell whose components are exactly these."""
    return matrix_toml(axes={"fsdp": ["none"], "optimizer": ["adamw"]}, suites={"resume": {}}, components=components)


USER_STACK = """
def build_model(cell, *, dtype, dropout=0.0):
    return None


def build_model_without_dropout(cell, *, dtype):
    return None


def build_model_positional_dtype(cell, dtype, dropout=0.0):
    return None


def build_optimizer(params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    return None


def parallelize(model, cell, *, device, activation_checkpointing=False):
    return model


class Checkpointer:
    def save(self, directory, *, model, optimizer, scheduler, loader, step):
        pass

    def load(self, directory, *, model, optimizer, scheduler, loader):
        return 0


class CheckpointerWithoutLoad:
    def save(self, directory, **pieces):
        pass


class Dataset:
    def __init__(self, path):
        self.path = path

    @classmethod
    def write(cls, path, *, vocab_size, num_sequences, seq_len, seed):
        pass

    def loader(self, *, batch_size, rank, world_size):
        return iter(())


NOT_A_FACTORY = 3
"""

NEEDS_A_MISSING_PACKAGE = (
    "import a_package_nobody_installed\n\ndef build_model(cell, *, dtype, dropout=0.0):\n    pass\n"
)

GOOD = {
    "model": "userstack.stack:build_model",
    "parallelize": "userstack.stack:parallelize",
    "optimizer_adamw": "userstack.stack:build_optimizer",
    "checkpointer": "userstack.stack:Checkpointer",
    "dataset": "userstack.stack:Dataset",
}


def problems_with(project: Project, **changes: str) -> list[str]:
    components = {key: value for key, value in {**GOOD, **changes}.items() if value}
    project.write("suites/test_resume.py", "")
    project.write("userstack/__init__.py", "")
    project.write("userstack/stack.py", USER_STACK)
    project.write("userstack/heavy.py", NEEDS_A_MISSING_PACKAGE)
    return check_components(load_matrix(project.write("matrix.toml", resume_matrix(components))))


def the_one_problem(project: Project, key: str, **changes: str) -> str:
    problems = problems_with(project, **changes)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{project.root / 'matrix.toml'}: components.{key}: "), problems[0]
    assert "\n" not in problems[0]
    return problems[0]


def test_components_that_follow_the_protocol_pass(project):
    assert problems_with(project) == []


def test_a_module_that_does_not_exist(project):
    problem = the_one_problem(project, "model", model="userstack.stak:build_model")
    assert "no module 'userstack.stak'" in problem and "fix the module path" in problem


def test_a_missing_attribute_names_the_close_one(project):
    problem = the_one_problem(project, "model", model="userstack.stack:build_modle")
    assert "has no attribute 'build_modle'; did you mean 'build_model'?" in problem


def test_a_signature_that_lacks_an_argument_some_suites_pass(project):
    problem = the_one_problem(project, "model", model="userstack.stack:build_model_without_dropout")
    assert "cannot take cell, *, dtype, dropout" in problem
    assert "make it accept model(cell, *, dtype, dropout=...)" in problem


def test_a_keyword_the_suites_pass_taken_positionally_is_fine(project):
    assert problems_with(project, model="userstack.stack:build_model_positional_dtype") == []


def test_an_optimizer_factory_that_cannot_take_the_optimizer_call(project):
    problem = the_one_problem(project, "optimizer_adamw", optimizer_adamw="userstack.stack:parallelize")
    assert "make it accept optimizer_adamw(params, *, lr, betas=..., eps=..., weight_decay=...)" in problem


def test_a_class_without_a_method_the_suites_call(project):
    problem = the_one_problem(project, "checkpointer", checkpointer="userstack.stack:CheckpointerWithoutLoad")
    assert "has no method 'load'; the suites call checkpointer().load(directory, *, model" in problem


def test_something_that_is_not_callable(project):
    problem = the_one_problem(project, "dataset", dataset="userstack.stack:NOT_A_FACTORY")
    assert "int is not callable" in problem


def test_a_component_a_registered_suite_needs_is_missing(project):
    problem = the_one_problem(project, "checkpointer", checkpointer="")
    assert "missing, and suite resume calls it" in problem


def test_a_missing_third_party_package_is_left_to_the_cells(project):
    """The suites skip or error such cells with the package's name (TransformerEngine on a CPU box)."""
    assert problems_with(project, model="userstack.heavy:build_model") == []


@pytest.mark.slow
def test_the_reference_components_and_the_hf_example_follow_the_protocol():
    assert check_components(load_matrix(REPO / "matrix.toml")) == []
    assert check_components(load_matrix(REPO / "examples" / "hf_llama" / "matrix.toml")) == []


def test_the_readme_shows_the_protocol_as_torchmatrix_protocol_has_it():
    assert protocol.markdown_table() in (REPO / "README.md").read_text()


@pytest.mark.slow
def test_run_stops_with_one_line_and_exit_2_before_any_cell(project):
    problems_with(project, model="userstack.stack:build_modle")
    done = project.torchmatrix("run", "--torch", "system", "--reports", "out", timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == (
        f"torchmatrix: error: {project.root / 'matrix.toml'}: components.model: 'userstack.stack' has no attribute"
        " 'build_modle'; did you mean 'build_model'?"
    )
    assert not (project.root / "out").exists(), "no cell may run"
