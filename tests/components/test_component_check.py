"""The pre-run component check: a user's components in a temporary package, checked against the
protocol in a child interpreter, each problem one line naming matrix.toml, the key and the fix;
a component whose package is missing is a warning saying whether its cells will error or skip."""

from __future__ import annotations

import inspect

import pytest

from torchmatrix.matrix.config import load_matrix
from torchmatrix.run.component_check import ComponentCheck, check_components

from helpers.checkout import REPO
from helpers.projects import Project
from helpers.user_stack import GOOD, USER_STACK, resume_matrix

NEEDS_A_MISSING_PACKAGE = (
    "import a_package_nobody_installed\n\ndef build_model(cell, *, dtype, dropout=0.0):\n    pass\n"
)


def checked(project: Project, optional: str = "", **changes: str) -> ComponentCheck:
    components = {key: value for key, value in {**GOOD, **changes}.items() if value}
    project.write("suites/test_resume.py", "")
    project.write("userstack/__init__.py", "")
    project.write("userstack/stack.py", USER_STACK)
    project.write("userstack/heavy.py", NEEDS_A_MISSING_PACKAGE)
    return check_components(load_matrix(project.write("matrix.toml", resume_matrix(components, optional))), "system")


def problems_with(project: Project, **changes: str) -> list[str]:
    return checked(project, **changes).problems


def the_one_problem(project: Project, key: str, **changes: str) -> str:
    problems = problems_with(project, **changes)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{project.root / 'matrix.toml'}: components.{key}: "), problems[0]
    assert "\n" not in problems[0]
    return problems[0]


def test_components_that_follow_the_protocol_pass(project):
    assert problems_with(project) == []


NOISY_MODULE = """
import atexit
import sys

sys.stdout.write("loading...")  # no newline: the answer line would start with it
atexit.register(print, '{"device_type": "cpu", "problems": [["model", "forged at exit"]], "missing": []}')
"""


def test_what_a_component_module_prints_at_import_and_at_exit_does_not_reach_the_answer(project):
    project.write("userstack/noisy.py", NOISY_MODULE + USER_STACK)
    problems = problems_with(project, model="userstack.noisy:build_modle")
    assert len(problems) == 1 and "has no attribute 'build_modle'" in problems[0], problems


def test_a_module_that_exits_at_import_leaves_no_answer_and_says_so(project):
    project.write("userstack/quits.py", "import sys\n\nprint('{}')\nsys.exit(3)\n")
    (problem,) = problems_with(project, model="userstack.quits:build_model")
    assert problem.startswith(f"{project.root / 'matrix.toml'}: components: the check could not run with ")
    assert problem.endswith("exit code 3, no answer")


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
    assert (
        "make it accept optimizer_adamw(params, *, lr, betas=..., eps=..., weight_decay=..., named_parameters=..., model=..., implementation=...)"
        in problem
    )


def test_a_class_without_a_method_the_suites_call(project):
    problem = the_one_problem(project, "checkpointer", checkpointer="userstack.stack:CheckpointerWithoutLoad")
    assert "has no method 'load'; the suites call checkpointer().load(directory, *, model" in problem


def test_something_that_is_not_callable(project):
    problem = the_one_problem(project, "dataset", dataset="userstack.stack:NOT_A_FACTORY")
    assert "int is not callable" in problem


def test_a_component_a_registered_suite_needs_is_missing(project):
    problem = the_one_problem(project, "checkpointer", checkpointer="")
    assert "missing, and suite resume calls it" in problem


def test_a_missing_third_party_package_is_a_warning_that_its_cells_will_error(project):
    check = checked(project, model="userstack.heavy:build_model")
    assert check.problems == []
    assert check.warnings == [
        f"{project.root / 'matrix.toml'}: components.model: model = userstack.heavy:build_model needs "
        "'a_package_nobody_installed', which is not installed here: its cells will error; install it, or declare "
        'the component optional: [optional] model = { device = ["cpu"] }'
    ]


def test_a_missing_package_of_a_component_optional_here_is_a_warning_that_its_cells_will_skip(project):
    check = checked(project, optional='model = { device = ["cpu"] }', model="userstack.heavy:build_model")
    assert check.problems == []
    assert check.warnings == [
        f"{project.root / 'matrix.toml'}: components.model: model = userstack.heavy:build_model needs "
        "'a_package_nobody_installed', which is not installed here: its cells will skip, as [optional] allows here"
    ]


def test_a_component_optional_only_elsewhere_still_errors(project):
    check = checked(project, optional='model = { device = ["cuda"] }', model="userstack.heavy:build_model")
    assert len(check.warnings) == 1 and "its cells will error" in check.warnings[0], check.warnings


def test_an_optimizer_container_without_state_or_param_groups_is_refused(project):
    problems = problems_with(project, optimizer_adamw="userstack.stack:OptimizersContainer")
    where = f"{project.root / 'matrix.toml'}: components.optimizer_adamw: what it returns (OptimizersContainer) lacks"
    assert problems == [
        f"{where} a `.state` mapping (the suites read optimizer.state[param]); return a torch.optim.Optimizer, "
        "or an object with it",
        f"{where} `.param_groups`, a list of dicts (the suites save, load and compare them); return a "
        "torch.optim.Optimizer, or an object with it",
    ]


def test_an_optimizer_container_built_from_the_model_passes(project):
    """The dummy build passes a module as `model=`; the container's state and lr are read off its inner optimizers."""
    assert problems_with(project, optimizer_adamw="userstack.stack:build_container_from_the_model") == []


def test_param_groups_without_lr_are_refused(project):
    problem = the_one_problem(project, "optimizer_adamw", optimizer_adamw="userstack.stack:build_groups_without_lr")
    assert "what it returns (AdamW) lacks `lr` in each of its param_groups" in problem


def test_an_object_without_the_optimizer_methods_is_refused_naming_them():
    from torchmatrix.components.optimizer_like import optimizer_like_problems

    class HalfAnOptimizer:
        state: dict = {}
        param_groups = [{"lr": 1e-3, "params": []}]

        def step(self):
            pass

    assert optimizer_like_problems(HalfAnOptimizer()) == [
        "what it returns (HalfAnOptimizer) lacks the methods zero_grad, state_dict, load_state_dict (the suites call "
        "them); return a torch.optim.Optimizer, or an object with it"
    ]


def test_a_factory_that_raises_on_the_dummy_parameter_is_left_to_the_cells(project):
    assert problems_with(project, optimizer_adamw="userstack.stack:build_optimizer_that_needs_a_gpu") == []


def test_an_optimizer_factory_taking_named_parameters_gets_them(project):
    """The dummy build passes them (the factory asserts their names), so a factory that takes
    them but mishandles them is refused like any other."""
    assert problems_with(project, optimizer_adamw="userstack.stack:build_optimizer_by_name") == []


def test_named_parameters_may_be_required_since_a_factory_naming_them_always_gets_them(project):
    assert problems_with(project, optimizer_adamw="userstack.stack:build_optimizer_needing_names") == []


def test_a_signature_problem_names_the_parameters_without_their_annotations(project):
    problem = the_one_problem(project, "parallelize", parallelize="userstack.stack:parallelize_with_long_annotations")
    assert "its signature (model, parallel_dims, job_config) cannot take model, cell, *, device" in problem
    assert "Sharding" not in problem and len(problem) < 500, problem


def test_a_signature_with_hundreds_of_parameters_is_cut():
    from torchmatrix.run.component_check import MAX_PARAMETERS_TEXT, parameter_names

    namespace = {}
    exec(f"def wide({', '.join(f'argument_{i}' for i in range(100))}, *, last): pass", namespace)
    text = parameter_names(inspect.signature(namespace["wide"]))
    assert len(text) == MAX_PARAMETERS_TEXT and text.startswith("argument_0, argument_1") and text.endswith("…")


def test_keyword_only_and_variadic_parameters_read_as_a_signature_does():
    from torchmatrix.run.component_check import parameter_names

    def factory(params, *args, lr: float = 1e-3, **kwargs):
        pass

    def builder(model, *, device):
        pass

    assert parameter_names(inspect.signature(factory)) == "params, *args, lr, **kwargs"
    assert parameter_names(inspect.signature(builder)) == "model, *, device"


@pytest.mark.slow
def test_the_reference_components_and_the_hf_example_follow_the_protocol():
    """TransformerEngine is missing on a CPU box, and matrix.toml declares its optimizer optional there."""
    check = check_components(load_matrix(REPO / "matrix.toml"), "2.13.0")
    assert check.problems == []
    assert all("its cells will skip" in line for line in check.warnings), check.warnings
    assert check_components(load_matrix(REPO / "examples" / "hf_llama" / "matrix.toml"), "2.13.0").problems == []


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


@pytest.mark.slow
def test_the_prefix_suffix_example_follows_the_protocol_with_no_body_calls_or_decoder_layers():
    """A function as checkpoint unit, a cache never returned and a tensor loss need nothing the check refuses."""
    matrix = load_matrix(REPO / "examples" / "prefix_suffix" / "matrix.toml")
    assert check_components(matrix, "2.13.0") == ComponentCheck()
