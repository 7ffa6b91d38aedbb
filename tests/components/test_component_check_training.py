"""The pre-run component check on the training side's forms (issue 30): a checkpointer in either
form (per-call, or bound to its objects and a process group), a scheduler builder, and one line
naming the fix for each wrong one."""

from __future__ import annotations

import pytest

from torchmatrix.matrix.config import load_matrix
from torchmatrix.run.component_check import check_components

from helpers.user_stack import GOOD, USER_STACK, resume_matrix

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


def problems_with(project, **changes: str) -> list[str]:
    components = {**GOOD, **changes}
    project.write("suites/test_resume.py", "")
    project.write("userstack/__init__.py", "")
    project.write("userstack/stack.py", USER_STACK)
    project.write("userstack/training.py", TRAINING_STACK)
    return check_components(load_matrix(project.write("matrix.toml", resume_matrix(components))), "system").problems


def problem_of(problems: list[str], project, key: str) -> str:
    """The one line about `key` among `problems`."""
    lines = [line for line in problems if line.startswith(f"{project.root / 'matrix.toml'}: components.{key}: ")]
    assert len(lines) == 1 and "\n" not in lines[0], problems
    return lines[0]


def test_bound_checkpointers_and_scheduler_builders_that_follow_the_protocol_pass(project):
    """With a process group or a mesh; scheduler builders get only the keywords they name."""
    good = {"checkpointer": "userstack.training:CheckpointManager", "scheduler": "userstack.training:cosine"}
    assert problems_with(project, **good) == []
    good = {"checkpointer": "userstack.training:MeshCheckpointManager", "scheduler": "userstack.training:by_cell"}
    assert problems_with(project, **good) == []


@pytest.mark.parametrize(
    ("checkpointer", "checkpointer_says", "scheduler", "scheduler_says"),
    [
        (
            "ManagerWithoutDirectory",
            (
                "cannot take directory, *, model, optimizer, scheduler, loader",
                "make it accept checkpointer(directory, *, model, optimizer, scheduler, loader",
            ),
            "needs_the_lr_too",
            ("cannot take optimizer", "make it accept scheduler(optimizer, *, warmup_steps=..."),
        ),
        (
            "ManagerSavingPerCall",
            ("cannot take step", ").save(step)"),
            "returns_a_number",
            ("what it returns (int) lacks step, state_dict, load_state_dict",),
        ),
    ],
)
def test_a_wrong_bound_checkpointer_and_scheduler_builder_get_a_line_each(
    project, checkpointer, checkpointer_says, scheduler, scheduler_says
):
    problems = problems_with(
        project, checkpointer=f"userstack.training:{checkpointer}", scheduler=f"userstack.training:{scheduler}"
    )
    assert len(problems) == 2, problems
    for key, says in (("checkpointer", checkpointer_says), ("scheduler", scheduler_says)):
        problem = problem_of(problems, project, key)
        assert all(text in problem for text in says), problem


def test_a_bound_checkpointer_without_load(project):
    problems = problems_with(project, checkpointer="userstack.training:ManagerWithoutLoad")
    problem = problem_of(problems, project, "checkpointer")
    assert "has no method 'load'; the suites call checkpointer(directory, *, model" in problem, problem
    assert problem.endswith(".load()"), problem
