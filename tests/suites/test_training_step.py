"""The `training_step` component (suites/components/training_step.py): the stack's loss, backward and optimizer
step where its object defines them, the plain ones where it does not or matrix.toml names none; and
the known-bad loss scaler of models/mutants/training_step.py skips exactly its first step."""

from __future__ import annotations

import torch
from torch import nn

from suites.components.training_step import PlainStep, TrainingStep, build_training_step
from torchmatrix.models.mutants.training_step import UncheckpointedLossScalerStep


class MeanOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return (self.weight * tokens).mean()


class DoubledBackward:
    """A stack's step that brings only its backward (as a loss scaler's `scale(loss).backward()`)."""

    def __init__(self, *, model, optimizer):
        self.calls = 0

    def backward(self, loss: torch.Tensor) -> None:
        self.calls += 1
        (loss * 2).backward()


def sgd_on(model: nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=1.0)


def run_one(step, model: nn.Module) -> torch.Tensor:
    step.backward(step.loss(torch.tensor([3.0, 6.0, 9.0])))
    grad = model.weight.grad.clone()
    step.optimizer_step()
    return grad


def test_without_a_component_the_step_is_the_plain_one():
    model = MeanOutput()
    step = build_training_step({}, model=model, optimizer=sgd_on(model), cell={})
    assert torch.equal(run_one(step, model), torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(model.weight.detach(), torch.tensor([0.0, -1.0, -2.0]))


def test_the_stacks_member_replaces_the_plain_one_and_the_others_stay_plain():
    model = MeanOutput()
    stack = DoubledBackward(model=model, optimizer=None)
    step = TrainingStep(stack, PlainStep(model=model, optimizer=sgd_on(model)))
    assert torch.equal(run_one(step, model), torch.tensor([2.0, 4.0, 6.0]))
    assert stack.calls == 1
    assert torch.equal(model.weight.detach(), torch.tensor([-1.0, -3.0, -5.0])), "the plain optimizer step ran"


def test_the_component_is_built_with_the_keywords_its_signature_names():
    model = MeanOutput()
    components = {"training_step": "test_training_step:DoubledBackward"}
    step = build_training_step(components, model=model, optimizer=sgd_on(model), cell={"fsdp": "none"})
    assert isinstance(step.stack, DoubledBackward)


def test_the_known_bad_loss_scaler_skips_its_first_step_then_steps_with_exact_gradients():
    model = MeanOutput()
    step = TrainingStep(
        UncheckpointedLossScalerStep(model=model, optimizer=sgd_on(model)), PlainStep(model=model, optimizer=None)
    )
    run_one(step, model)
    assert torch.equal(model.weight.detach(), torch.ones(3)), "the calibrating step must be skipped"
    model.weight.grad = None
    run_one(step, model)
    assert torch.equal(model.weight.detach(), torch.tensor([0.0, -1.0, -2.0])), "unscaled exactly, then stepped"
