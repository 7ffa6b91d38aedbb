"""The pre-run component check: a user's components in a temporary package, checked against the
protocol in a child interpreter, each problem one line naming matrix.toml, the key and the fix;
a component whose package is missing is a warning saying whether its cells will error or skip.
The training side's forms (issue 30) too: a checkpointer per-call or bound to its objects and a
process group, a scheduler builder."""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from torchmatrix.matrix.config import load_matrix
from torchmatrix.messages.compile_keys import build_facts
from torchmatrix.run.component_check import ComponentCheck, check_components

from helpers.checkout import REPO
from helpers.projects import Project
from helpers.user_stack import GOOD, USER_STACK, resume_matrix

NEEDS_A_MISSING_PACKAGE = (
    "import a_package_nobody_installed\n\ndef build_model(cell, *, dtype, dropout=0.0):\n    pass\n"
)

NOISY_MODULE = """
import atexit
import sys

sys.stdout.write("loading...")  # no newline: the answer line would start with it
atexit.register(print, '{"device_type": "cpu", "problems": [["model", "forged at exit"]], "missing": []}')
"""

TRAINING_STACK = """
import torch


class CheckpointManager:
    def __init__(self, directory, *, model, optimizer, scheduler, loader, process_group=None):
        self.directory = directory

    def save(self, step):
        return {"tokens_seen": 0}

    def load(self):
        return {"step": 0, "tokens_seen": 0}


class MeshCheckpointManager(CheckpointManager):
    def __init__(self, directory, *, model, optimizer, scheduler, loader, mesh):
        self.directory = directory


class ManagerWithoutDirectory:
    def __init__(self, *, model, optimizer, scheduler, loader):
        pass

    def save(self, step):
        pass

    def load(self):
        return 0


class ManagerSavingPerCall(CheckpointManager):
    def save(self, directory, *, model, optimizer, scheduler, loader, step):
        pass


class ManagerWithoutLoad:
    def __init__(self, directory, *, model, optimizer, scheduler, loader):
        pass

    def save(self, step):
        pass


def cosine(optimizer, *, warmup_steps, total_steps):
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)


def by_cell(optimizer, *, cell):
    return torch.optim.lr_scheduler.ConstantLR(optimizer)


def needs_the_lr_too(optimizer, lr):
    return torch.optim.lr_scheduler.ConstantLR(optimizer)


def returns_a_number(optimizer, *, warmup_steps):
    return warmup_steps
"""


CASES = {  # each case: the components it changes from GOOD ("" leaves one out)
    "good": {},
    "noisy": {"model": "userstack.noisy:build_modle"},
    "exits_at_import": {"model": "userstack.quits:build_model"},
    "no_such_module": {"model": "userstack.stak:build_model"},
    "misspelt_attribute": {"model": "userstack.stack:build_modle"},
    "without_dropout": {"model": "userstack.stack:build_model_without_dropout"},
    "positional_dtype": {"model": "userstack.stack:build_model_positional_dtype"},
    "heavy": {"model": "userstack.heavy:build_model"},
    "heavy_optional_here": {"model": "userstack.heavy:build_model"},
    "heavy_optional_elsewhere": {"model": "userstack.heavy:build_model"},
    "optimizer_is_parallelize": {"optimizer_adamw": "userstack.stack:parallelize"},
    "container_without_state": {"optimizer_adamw": "userstack.stack:OptimizersContainer"},
    "container_from_the_model": {"optimizer_adamw": "userstack.stack:build_container_from_the_model"},
    "groups_without_lr": {"optimizer_adamw": "userstack.stack:build_groups_without_lr"},
    "raises_on_the_dummy": {"optimizer_adamw": "userstack.stack:build_optimizer_that_needs_a_gpu"},
    "optimizer_by_name": {"optimizer_adamw": "userstack.stack:build_optimizer_by_name"},
    "optimizer_needing_names": {"optimizer_adamw": "userstack.stack:build_optimizer_needing_names"},
    "checkpointer_without_load": {"checkpointer": "userstack.stack:CheckpointerWithoutLoad"},
    "checkpointer_missing": {"checkpointer": ""},
    "scaled_backward": {"training_step": "userstack.stack:ScaledBackwardStep"},
    "backward_without_the_loss": {"training_step": "userstack.stack:BackwardWithoutTheLoss"},
    "not_callable": {"dataset": "userstack.stack:NOT_A_FACTORY"},
    "long_annotations": {"parallelize": "userstack.stack:parallelize_with_long_annotations"},
    "bound_checkpointer_and_scheduler": {
        "checkpointer": "userstack.training:CheckpointManager",
        "scheduler": "userstack.training:cosine",
    },
    "mesh_checkpointer_and_scheduler_by_cell": {
        "checkpointer": "userstack.training:MeshCheckpointManager",
        "scheduler": "userstack.training:by_cell",
    },
    "checkpointer_without_directory": {
        "checkpointer": "userstack.training:ManagerWithoutDirectory",
        "scheduler": "userstack.training:needs_the_lr_too",
    },
    "checkpointer_saving_per_call": {
        "checkpointer": "userstack.training:ManagerSavingPerCall",
        "scheduler": "userstack.training:returns_a_number",
    },
    "bound_checkpointer_without_load": {"checkpointer": "userstack.training:ManagerWithoutLoad"},
}
OPTIONAL = {
    "heavy_optional_here": 'model = { device = ["cpu"] }',
    "heavy_optional_elsewhere": 'model = { device = ["cuda"] }',
}
ALONE = {"good", "exits_at_import", *OPTIONAL}
"""Cases checked in a child of their own: every key unchanged, a module that ends the child at import,
an `[optional]` table. The others share a child with cases that change other keys."""


def batches() -> list[list[str]]:
    """The cases packed into as few checks as their keys allow: the child checks each component on its
    own (component_check.problems_of), so cases changing different keys can share one child interpreter
    (about 6 CPU seconds each: torch imported, an optimizer built)."""
    packed: list[list[str]] = []
    for name, changes in CASES.items():
        fits = [
            batch
            for batch in packed
            if name not in ALONE and batch[0] not in ALONE and not any(set(changes) & set(CASES[n]) for n in batch)
        ]
        if fits:
            fits[0].append(name)
        else:
            packed.append([name])
    return packed


def checked(project: Project, optional: str = "", **changes: str) -> ComponentCheck:
    components = {key: value for key, value in {**GOOD, **changes}.items() if value}
    project.write("suites/test_resume.py", "")
    project.write("userstack/__init__.py", "")
    project.write("userstack/stack.py", USER_STACK)
    project.write("userstack/training.py", TRAINING_STACK)
    project.write("userstack/heavy.py", NEEDS_A_MISSING_PACKAGE)
    project.write("userstack/noisy.py", NOISY_MODULE + USER_STACK)
    project.write("userstack/quits.py", "import sys\n\nprint('{}')\nsys.exit(3)\n")
    return check_components(load_matrix(project.write("matrix.toml", resume_matrix(components, optional))), "system")


@dataclass
class CaseCheck:
    """What the check said about one case: its matrix.toml, and the lines naming the keys it changes
    (every line, for a case checked alone)."""

    matrix: Path
    problems: list[str]
    warnings: list[str]


class CaseChecks:
    """Each batch of cases checked once, when a test first asks for one of its cases."""

    def __init__(self, root: Path):
        self.root = root
        self.batches = batches()
        self.found: dict[str, CaseCheck] = {}

    def __getitem__(self, name: str) -> CaseCheck:
        if name not in self.found:
            index, batch = next((i, batch) for i, batch in enumerate(self.batches) if name in batch)
            self.found.update(self._check(index, batch))
        return self.found[name]

    def _check(self, index: int, batch: list[str]) -> dict[str, CaseCheck]:
        project = Project(self.root / f"batch-{index}")
        changes = {key: value for name in batch for key, value in CASES[name].items()}
        check = checked(project, OPTIONAL.get(batch[0], ""), **changes)
        matrix = project.root / "matrix.toml"
        if len(batch) == 1:
            return {batch[0]: CaseCheck(matrix, check.problems, check.warnings)}

        def naming(lines: list[str], keys) -> list[str]:
            return [line for line in lines if any(line.startswith(f"{matrix}: components.{key}: ") for key in keys)]

        stray = [line for line in check.problems + check.warnings if line not in naming([line], changes)]
        assert stray == [], f"lines about components no case of the batch changed: {stray}"
        return {
            name: CaseCheck(matrix, naming(check.problems, CASES[name]), naming(check.warnings, CASES[name]))
            for name in batch
        }


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> CaseChecks:
    return CaseChecks(tmp_path_factory.mktemp("component-checks"))


def the_one_problem(checks: CaseChecks, case: str) -> str:
    (key,) = CASES[case]
    found = checks[case]
    assert len(found.problems) == 1, found.problems
    assert found.problems[0].startswith(f"{found.matrix}: components.{key}: "), found.problems[0]
    assert "\n" not in found.problems[0]
    return found.problems[0]


def packing_problems(packed: list[list[str]]) -> list[str]:
    """What is wrong with a packing of CASES: a case missing or twice, an ALONE case sharing, two cases of one key."""
    problems = [] if sorted(name for batch in packed for name in batch) == sorted(CASES) else ["not each case once"]
    for batch in packed:
        keys = [key for name in batch for key in CASES[name]]
        if len(batch) > 1 and set(batch) & ALONE:
            problems.append(f"{batch}: a case that needs a child of its own shares one")
        if len(keys) != len(set(keys)):
            problems.append(f"{batch}: two cases change one component")
    return problems


def test_the_cases_share_children_without_two_changing_one_key():
    packed = batches()
    assert packing_problems(packed) == []
    assert len(packed) < len(CASES) / 2, packed
    clashing = [["no_such_module", "misspelt_attribute"], *([name] for name in CASES if "model" not in CASES[name])]
    assert packing_problems(clashing) != [], "a packing where two cases change the model must be refused"


def test_a_line_about_a_component_no_case_of_the_batch_changed_fails_the_batch(tmp_path, monkeypatch):
    """A shared check whose answer names an unchanged component (a case leaking into GOOD's keys) is not split up."""
    checks = CaseChecks(tmp_path)
    index, batch = next((i, batch) for i, batch in enumerate(checks.batches) if "misspelt_attribute" in batch)
    unchanged = next(key for key in GOOD if all(key not in CASES[name] for name in batch))
    stray = ComponentCheck(problems=[f"{tmp_path / f'batch-{index}' / 'matrix.toml'}: components.{unchanged}: broken"])
    monkeypatch.setattr(sys.modules[__name__], "checked", lambda *args, **kwargs: stray)
    with pytest.raises(AssertionError, match="lines about components no case of the batch changed"):
        checks["misspelt_attribute"]


def test_components_that_follow_the_protocol_pass(checks):
    assert checks["good"].problems == []


def test_what_a_component_module_prints_at_import_and_at_exit_does_not_reach_the_answer(checks):
    problems = checks["noisy"].problems
    assert len(problems) == 1 and "has no attribute 'build_modle'" in problems[0], problems


def test_a_module_that_exits_at_import_leaves_no_answer_and_says_so(checks):
    found = checks["exits_at_import"]
    (problem,) = found.problems
    assert problem.startswith(f"{found.matrix}: components: the check could not run with ")
    assert problem.endswith("exit code 3, no answer")


def test_a_module_that_does_not_exist(checks):
    problem = the_one_problem(checks, "no_such_module")
    assert "no module 'userstack.stak'" in problem and "fix the module path" in problem


def test_a_missing_attribute_names_the_close_one(checks):
    problem = the_one_problem(checks, "misspelt_attribute")
    assert "has no attribute 'build_modle'; did you mean 'build_model'?" in problem


def test_a_signature_that_lacks_an_argument_some_suites_pass(checks):
    problem = the_one_problem(checks, "without_dropout")
    assert "cannot take cell, *, dtype, dropout" in problem
    assert "make it accept model(cell, *, dtype, dropout=...)" in problem


def test_a_keyword_the_suites_pass_taken_positionally_is_fine(checks):
    assert checks["positional_dtype"].problems == []


def test_an_optimizer_factory_that_cannot_take_the_optimizer_call(checks):
    problem = the_one_problem(checks, "optimizer_is_parallelize")
    assert (
        "make it accept optimizer_adamw(params, *, lr, betas=..., eps=..., weight_decay=..., named_parameters=..., model=..., implementation=...)"
        in problem
    )


def test_a_class_without_a_method_the_suites_call(checks):
    problem = the_one_problem(checks, "checkpointer_without_load")
    assert "has no method 'load'; the suites call checkpointer().load(directory, *, model" in problem


def test_a_training_step_may_leave_out_members_the_suites_have_defaults_for(checks):
    assert checks["scaled_backward"].problems == []


def test_a_training_step_member_that_cannot_take_the_suites_call_is_refused(checks):
    problem = the_one_problem(checks, "backward_without_the_loss")
    assert "make it accept training_step(*, model, optimizer, cell=...).backward(loss)" in problem, problem


def test_something_that_is_not_callable(checks):
    problem = the_one_problem(checks, "not_callable")
    assert "int is not callable" in problem


def test_a_component_a_registered_suite_needs_is_missing(checks):
    problem = the_one_problem(checks, "checkpointer_missing")
    assert "missing, and suite resume calls it" in problem


def the_line_about(found: CaseCheck, key: str) -> str:
    """The one line of a case's check about `key`."""
    lines = [line for line in found.problems if line.startswith(f"{found.matrix}: components.{key}: ")]
    assert len(lines) == 1 and "\n" not in lines[0], found.problems
    return lines[0]


def test_bound_checkpointers_and_scheduler_builders_that_follow_the_protocol_pass(checks):
    """With a process group or a mesh; scheduler builders get only the keywords they name."""
    assert checks["bound_checkpointer_and_scheduler"].problems == []
    assert checks["mesh_checkpointer_and_scheduler_by_cell"].problems == []


@pytest.mark.parametrize(
    ("case", "checkpointer_says", "scheduler_says"),
    [
        (
            "checkpointer_without_directory",
            (
                "cannot take directory, *, model, optimizer, scheduler, loader",
                "make it accept checkpointer(directory, *, model, optimizer, scheduler, loader",
            ),
            ("cannot take optimizer", "make it accept scheduler(optimizer, *, warmup_steps=..."),
        ),
        (
            "checkpointer_saving_per_call",
            ("cannot take step", ").save(step)"),
            ("what it returns (int) lacks step, state_dict, load_state_dict",),
        ),
    ],
)
def test_a_wrong_bound_checkpointer_and_scheduler_builder_get_a_line_each(
    checks, case, checkpointer_says, scheduler_says
):
    found = checks[case]
    assert len(found.problems) == 2, found.problems
    for key, says in (("checkpointer", checkpointer_says), ("scheduler", scheduler_says)):
        problem = the_line_about(found, key)
        assert all(text in problem for text in says), problem


def test_a_bound_checkpointer_without_load(checks):
    problem = the_line_about(checks["bound_checkpointer_without_load"], "checkpointer")
    assert "has no method 'load'; the suites call checkpointer(directory, *, model" in problem, problem
    assert problem.endswith(".load()"), problem


def test_a_missing_third_party_package_is_a_warning_that_its_cells_will_error(checks):
    found = checks["heavy"]
    assert found.problems == []
    assert found.warnings == [
        f"{found.matrix}: components.model: model = userstack.heavy:build_model needs "
        "'a_package_nobody_installed', which is not installed here: its cells will error; install it, or declare "
        'the component optional: [optional] model = { device = ["cpu"] }'
    ]


def test_a_missing_package_of_a_component_optional_here_is_a_warning_that_its_cells_will_skip(checks):
    found = checks["heavy_optional_here"]
    assert found.problems == []
    assert found.warnings == [
        f"{found.matrix}: components.model: model = userstack.heavy:build_model needs "
        "'a_package_nobody_installed', which is not installed here: its cells will skip, as [optional] allows here"
    ]


def test_a_component_optional_only_elsewhere_still_errors(checks):
    warnings = checks["heavy_optional_elsewhere"].warnings
    assert len(warnings) == 1 and "its cells will error" in warnings[0], warnings


def test_an_optimizer_container_without_state_or_param_groups_is_refused(checks):
    found = checks["container_without_state"]
    where = f"{found.matrix}: components.optimizer_adamw: what it returns (OptimizersContainer) lacks"
    assert found.problems == [
        f"{where} a `.state` mapping (the suites read optimizer.state[param]); return a torch.optim.Optimizer, "
        "or an object with it",
        f"{where} `.param_groups`, a list of dicts (the suites save, load and compare them); return a "
        "torch.optim.Optimizer, or an object with it",
    ]


def test_an_optimizer_container_built_from_the_model_passes(checks):
    """The dummy build passes a module as `model=`; the container's state and lr are read off its inner optimizers."""
    assert checks["container_from_the_model"].problems == []


def test_param_groups_without_lr_are_refused(checks):
    problem = the_one_problem(checks, "groups_without_lr")
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


def test_a_factory_that_raises_on_the_dummy_parameter_is_left_to_the_cells(checks):
    assert checks["raises_on_the_dummy"].problems == []


def test_an_optimizer_factory_taking_named_parameters_gets_them(checks):
    """The dummy build passes them (the factory asserts their names), so a factory that takes
    them but mishandles them is refused like any other."""
    assert checks["optimizer_by_name"].problems == []


def test_named_parameters_may_be_required_since_a_factory_naming_them_always_gets_them(checks):
    assert checks["optimizer_needing_names"].problems == []


def test_a_signature_problem_names_the_parameters_without_their_annotations(checks):
    problem = the_one_problem(checks, "long_annotations")
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
    one_gpu = load_matrix(REPO / "examples" / "one_gpu" / "matrix.toml")
    assert check_components(one_gpu, "2.13.0").problems == []
    assert {cell.world_size for cell in one_gpu.cells()} == {1}, "one GPU runs world size 1 alone"


@pytest.mark.slow
def test_the_check_says_the_build_facts_of_the_key_the_ranks_compile_under():
    """The runner names the compile store's folder for this run from them (with the device and the
    matrix's digest), to tell the ETA which cells' graphs are there: they are what a rank computes."""
    matrix = load_matrix(REPO / "matrix.toml")
    suite_files = [matrix.root / suite.path for suite in matrix.suites.values()]
    check = check_components(matrix, "2.13.0", suite_files=suite_files)
    assert check.build == build_facts(components=matrix.components, suite_files=suite_files)


@pytest.mark.slow
def test_run_stops_with_one_line_and_exit_2_before_any_cell(project):
    assert len(checked(project, model="userstack.stack:build_modle").problems) == 1
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
