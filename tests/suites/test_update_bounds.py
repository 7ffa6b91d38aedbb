"""The derived bound between two AdamW implementations holds and means something: torch's for-loop,
foreach and fused steps each lie within half of it from the float64 step (so any two within it), over
gradients, moments and parameters of many magnitudes and steps, while each class of broken update
(weight decay skipped, another bias correction, eps elsewhere) lies orders of magnitude outside it;
and the for-loop twin of suites/references/optimizer_twin.py names each class's cause. No rank processes: the
fast lane (Inductor's compiled step is measured by tests/suites/test_optimizer_impl_mutants.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchmatrix.models.mutants import optimizer_impl as mutants
from torchmatrix.suites.comparison.update_bounds import BOUNDED_KEYS, AdamWStep, bias_correction_roundings
from torchmatrix.suites.references.optimizer_twin import OptimizerSteps
from torchmatrix.testing import build_optimizer

ELEMENTS = 4096
HYPERPARAMETERS = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
FLAGS = {"forloop": dict(foreach=False, fused=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}


def step_inputs(step: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Parameter, gradient and the moments an AdamW at `step` - 1 may hold: float32 values of mixed
    signs and magnitudes over ten decades, the moments those of earlier gradients like it."""
    generator = torch.Generator().manual_seed(seed)

    def spread(decades: float) -> torch.Tensor:
        scale = torch.exp(torch.randn(ELEMENTS, generator=generator, dtype=torch.float64) * decades)
        return torch.randn(ELEMENTS, generator=generator, dtype=torch.float64) * scale

    param, grad = 0.02 * spread(1.0), 1e-3 * spread(2.5)
    if step == 1:
        return param.float(), grad.float(), torch.zeros(ELEMENTS), torch.zeros(ELEMENTS)
    earlier = 1e-3 * spread(2.5)
    return param.float(), grad.float(), (0.5 * earlier).float(), (earlier * earlier).float()


def one_step(optimizer_class, inputs: tuple[torch.Tensor, ...], step: int, **flags) -> dict[str, torch.Tensor]:
    """One step of `optimizer_class` from `inputs` at `step`: the new parameter and moments."""
    param, grad, exp_avg, exp_avg_sq = (tensor.clone() for tensor in inputs)
    param = nn.Parameter(param)
    param.grad = grad
    optimizer = optimizer_class([param], **HYPERPARAMETERS, **flags)
    if step > 1:
        optimizer.state[param] = {"step": torch.tensor(step - 1.0), "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    optimizer.step()
    state = optimizer.state[param]
    return {"param": param.detach(), "exp_avg": state["exp_avg"], "exp_avg_sq": state["exp_avg_sq"]}


def setting(step: int) -> AdamWStep:
    beta1, beta2 = HYPERPARAMETERS["betas"]
    return AdamWStep(HYPERPARAMETERS["lr"], beta1, beta2, HYPERPARAMETERS["eps"], HYPERPARAMETERS["weight_decay"], step)


def ratios(result: dict, reference: dict, bounds: dict) -> dict[str, float]:
    return {key: float(((result[key].double() - reference[key].double()).abs() / bounds[key]).max()) for key in bounds}


@pytest.mark.parametrize("step", [1, 2, 3, 6, 100])
@pytest.mark.parametrize("implementation", sorted(FLAGS))
def test_each_implementation_lies_within_half_the_bound_of_the_exact_step(implementation, step):
    inputs = step_inputs(step, seed=step)
    result = one_step(torch.optim.AdamW, inputs, step, **FLAGS[implementation])
    exact = setting(step).exact(*inputs)
    half = {key: bound / 2 for key, bound in setting(step).bounds(*inputs).items()}
    assert max(ratios(result, exact, half).values()) <= 1


def test_fused_differs_from_the_forloop_and_stays_within_the_bound():
    """The bound is not met by equality alone: fused rounds otherwise than the for-loop on CPU."""
    inputs = step_inputs(3)
    fused, forloop = (one_step(torch.optim.AdamW, inputs, 3, **FLAGS[name]) for name in ("fused", "forloop"))
    assert not torch.equal(fused["param"], forloop["param"])
    assert 0 < ratios(fused, forloop, setting(3).bounds(*inputs))["param"] <= 1


@pytest.mark.parametrize(
    "mutant",
    [
        mutants.NoDecayOnVectorsAdamW,
        mutants.UnrootedBiasCorrectionAdamW,
        mutants.StepAheadBiasCorrectionAdamW,
        mutants.EpsInsideSqrtAdamW,
        mutants.EpsBeforeBiasCorrectionAdamW,
    ],
)
def test_a_broken_update_lies_far_outside_the_bound(mutant):
    inputs = step_inputs(2)
    result = one_step(mutant, inputs, 2)
    reference = one_step(torch.optim.AdamW, inputs, 2, **FLAGS["forloop"])
    assert ratios(result, reference, setting(2).bounds(*inputs))["param"] > 30


def test_ill_conditioned_bias_corrections_count_more_roundings():
    """1 - beta**step from a rounded beta loses digits as beta**step nears 1: early steps, beta2 near 1."""
    assert bias_correction_roundings(0.999, 1) > 100 * bias_correction_roundings(0.9, 50)
    assert setting(1).update_roundings > setting(100).update_roundings
    assert set(setting(1).bounds(*step_inputs(1))) == set(BOUNDED_KEYS)


class Tiny(nn.Module):
    """A matrix, a norm's weight and a bias: a 1-D parameter for the weight-decay mutants to skip."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, batch):
        return (self.norm(self.proj(batch)) - batch.flip(-1)).pow(2).mean()


def twin_checks(factory, implementation: str = "fused", steps: int = 3) -> list:
    """`steps` steps of `factory`'s `implementation` on Tiny, each compared with its for-loop twin."""
    model = Tiny()
    optimizer = build_optimizer(factory, model, implementation=implementation, **HYPERPARAMETERS)
    twin = build_optimizer(factory, model, implementation="forloop", **HYPERPARAMETERS)
    watch = OptimizerSteps(model, optimizer, twin)
    for seed in range(steps):
        model(torch.randn(4, 16, generator=torch.Generator().manual_seed(seed))).backward()
        before = watch.before_step()
        optimizer.step()
        watch.after_step(before)
        optimizer.zero_grad()
    return watch.checks


@pytest.mark.parametrize(
    "factory",
    [
        mutants.build_adamw,
        mutants.build_hand_written,
        mutants.build_bucketed_fused,
        mutants.build_adamw_taking_checkpoint_kernels,
    ],
)
def test_valid_implementations_match_their_forloop_twin(factory):
    checks = twin_checks(factory)
    assert [check.difference for check in checks] == [None] * 3
    assert max(check.max_ratio for check in checks) <= 1


@pytest.mark.parametrize(
    ("factory", "cause"),
    [
        (mutants.build_no_decay_on_vectors, "one of them leaves the weight decay out"),
        (mutants.build_no_decay_after_first_group, "one of them leaves the weight decay out"),
        (mutants.build_first_group_bucketed, "weight decays 0.1 apart (its param group: weight_decay 0)"),
        (mutants.build_double_counting, "step of proj.weight is 2.0 in the cell, 1.0 in the for-loop twin"),
        (mutants.build_unrooted_bias_correction, "a bias correction (or the learning rate) differs"),
        (mutants.build_step_ahead_bias_correction, "a bias correction (or the learning rate) differs"),
        (mutants.build_eps_inside_sqrt, "the denominator sqrt(v_hat) + eps differs"),
    ],
)
def test_each_broken_update_is_named_by_its_cause_at_the_first_step(factory, cause):
    first = twin_checks(factory)[0]
    assert first.difference and first.difference.startswith("step 1: ") and cause in first.difference, first.difference
    assert "bound: AdamW step 1 in float32" in first.difference
