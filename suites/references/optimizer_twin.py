"""The for-loop twin: the cell's optimizer factory built again in its for-loop implementation over
the same parameters, stepped from each step's parameters, gradients and state as the cell's optimizer
had them, and the result compared with the cell's within suites/comparison/update_bounds.py's derived bound. A
cell is then compared with an independent reference every step, not only with itself, so an
implementation that skips weight decay for some parameters, counts its own steps or corrects its
bias otherwise fails, naming what differs (docs/explanation/optimizer-implementations.md).

Under FSDP2 the parameters and state are DTensors: AdamW's update is elementwise, so each rank
compares its own shards, and the bound per element holds for each shard alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from torchmatrix.testing import UnavailableImplementation, build_optimizer, inner_optimizers

from ..comparison.update_bounds import BOUNDED_KEYS, AdamWStep
from ..state.built_names import named_parameters_as_built
from ..state.optimizer_state import local_part, optimizer_state_of, param_groups_of

TWIN_IMPLEMENTATION = "forloop"
NOT_HYPERPARAMETERS = ("params", "lr", "initial_lr", "foreach", "fused", "capturable")
"""Param-group entries not compared with the twin's: `lr` follows the cell's scheduler (copied into
the twin every step), the kernel flags differ by implementation by design."""
MOMENTS = BOUNDED_KEYS[1:]
UNSUPPORTED_GROUP_FLAGS = ("amsgrad", "maximize", "differentiable")
BOUNDED_DTYPES = (torch.float32, torch.float64)
CAUSE_SHARE = 0.99
"""The share of the differing elements a cause must explain to be named (eps reshapes a few)."""
CAUSE_SLACK = 0.05
"""How far from the candidate term, relative to it, an explained element may lie."""


@dataclass
class StepValues:
    """One rank's local values of every parameter and its AdamW moments, by parameter name, on the
    CPU, and each parameter's `step` as a number."""

    values: dict[str, dict[str, torch.Tensor]]
    steps: dict[str, float]


@dataclass
class StepCheck:
    """One optimizer step compared with a reference: the first thing that differs (None when none
    does), the largest |cell - reference| / bound (inf where `step` differs), the bound that step ran
    under, and the largest |cell - reference|."""

    step: int
    difference: str | None
    max_ratio: float
    bound: str
    max_abs: float = 0.0


@dataclass
class KeptStep:
    """A step of the run kept for a later comparison: what it started from, the gradients it used,
    what it made, and each parameter's AdamW setting (or why there is none: not AdamW's param groups)."""

    inputs: StepValues
    grads: dict[str, torch.Tensor]
    result: StepValues
    settings: dict[str, AdamWStep] | str


def local_copy(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor, copied to the CPU (a DTensor's local shard)."""
    return local_part(tensor).detach().to("cpu", copy=True)


def step_values(params: list[tuple[str, torch.nn.Parameter]], optimizer) -> StepValues:
    """The local values of `params` and of their AdamW state in `optimizer`."""
    states = optimizer_state_of(optimizer)
    values, steps = {}, {}
    for name, param in params:
        state = states.get(param, {})
        values[name] = {"param": local_copy(param)} | {key: local_copy(state[key]) for key in MOMENTS if key in state}
        if "step" in state:
            steps[name] = float(state["step"])
    return StepValues(values, steps)


def local_grads(params: list[tuple[str, torch.nn.Parameter]]) -> dict[str, torch.Tensor]:
    """Each parameter's gradient as its local shard, laid out like the parameter (FSDP2's reduce-scatter
    leaves it so; a gradient in other placements is redistributed first, as AdamW on DTensors does)."""
    from torch.distributed.tensor import DTensor

    grads = {}
    for name, param in params:
        grad = param.grad
        if isinstance(grad, DTensor) and grad.placements != param.placements:
            grad = grad.redistribute(param.device_mesh, param.placements)
        if grad is not None:
            grads[name] = local_copy(grad)
    return grads


def build_twin(factory, model, implementation: str, **hyperparameters):
    """The factory's for-loop build over `model`'s parameters, or why there is none to compare with
    here (the reason the check skips with)."""
    if implementation == TWIN_IMPLEMENTATION:
        return "the cell's own implementation is the for-loop reference: nothing to compare it with"
    try:
        twin = build_optimizer(factory, model, implementation=TWIN_IMPLEMENTATION, **hyperparameters)
    except UnavailableImplementation as unavailable:
        return f"the factory builds no for-loop twin here: {unavailable}"
    if dtypes := sorted({str(p.dtype) for p in model.parameters() if p.dtype not in BOUNDED_DTYPES}):
        return (
            f"the bound is derived for float32 and float64 params; these are {', '.join(dtypes)}, whose for-loop "
            "step rounds every operation to that dtype and whose ill-conditioned scalars leave no useful bound"
        )
    parts = inner_optimizers(twin)
    flags = sorted({flag for group in param_groups_of(twin) for flag in UNSUPPORTED_GROUP_FLAGS if group.get(flag)})
    if flags or not all(isinstance(part, torch.optim.AdamW) for part in parts):
        return (
            f"the bound is derived for torch.optim.AdamW's update without {', '.join(UNSUPPORTED_GROUP_FLAGS)}; "
            f"the for-loop build is {', '.join(type(part).__name__ for part in parts)}"
            + (f" with {', '.join(flags)}" if flags else "")
        )
    return twin


class OptimizerSteps:
    """Watches a run's optimizer steps (numbered from 1): keeps those in `keep` for a later
    comparison, and with a `twin` (build_twin) compares each with the twin's step from the same
    parameters, gradients and state, leaving the cell's result in place."""

    def __init__(self, model, optimizer, twin=None, keep: tuple[int, ...] = (), unavailable: str | None = None):
        self.optimizer, self.twin, self.keep, self.unavailable = optimizer, twin, keep, unavailable
        self.params = named_parameters_as_built(model)
        self.checks: list[StepCheck] = []
        self.kept: dict[int, KeptStep] = {}
        self.step = 0

    def before_step(self) -> tuple[StepValues, dict] | None:
        """The parameters and state as the optimizer is about to step them, the state also cloned as
        held; None where the coming step is neither kept nor compared."""
        if self.twin is None and self.step + 1 not in self.keep:
            return None
        names = {param: name for name, param in self.params}
        held = {
            names[param]: {
                key: value.detach().clone() if isinstance(value, torch.Tensor) else value
                for key, value in state.items()
            }
            for param, state in optimizer_state_of(self.optimizer).items()
            if param in names
        }
        return step_values(self.params, self.optimizer), held

    def after_step(self, before: tuple[StepValues, dict] | None) -> None:
        """Keep and compare the step the optimizer just took from `before`."""
        self.step += 1
        if before is None:
            return
        inputs, held = before
        result = step_values(self.params, self.optimizer)
        if result.steps == inputs.steps and all(
            torch.equal(result.values[name]["param"], inputs.values[name]["param"]) for name in result.values
        ):
            return  # the step was skipped (a loss scaler calibrating): nothing to compare
        grads = local_grads(self.params)
        if self.step in self.keep:
            self.kept[self.step] = KeptStep(inputs, grads, result, adamw_settings(self.params, self.optimizer, result))
        if self.twin is None:
            return
        twin = self.step_twin(inputs, held, result)
        settings = grouping_difference(self.params, self.optimizer, self.twin) or adamw_settings(
            self.params, self.twin, twin
        )
        if isinstance(settings, str):
            self.checks.append(StepCheck(self.step, f"step {self.step}: {settings}", float("inf"), ""))
        else:
            sides = ("cell", "for-loop twin")
            self.checks.append(compare_step(self.step, result, twin, inputs, grads, settings, sides))

    def verdict(self) -> dict:
        """What the twin found over the steps so far, as plain values a rank sends the test:
        `{"unavailable": why}`, or the first difference of each step that has one, the largest
        ratio to the bound and |difference|, the last step's bound and how many steps were compared."""
        if self.twin is None:
            return {"unavailable": self.unavailable or "no for-loop twin was built for this run"}
        return {
            "differences": [check.difference for check in self.checks if check.difference],
            "max_ratio": max((check.max_ratio for check in self.checks), default=0.0),
            "max_abs": max((check.max_abs for check in self.checks), default=0.0),
            "bound": self.checks[-1].bound if self.checks else "",
            "steps": len(self.checks),
        }

    def step_twin(self, inputs: StepValues, held: dict, result: StepValues) -> StepValues:
        """Put `inputs` into the parameters and `held` into the twin's state, copy the cell's current
        LR into the twin's groups, step the twin, read it, and put the cell's `result` back."""
        holder = {param: part for part in inner_optimizers(self.twin) for param in params_of(part)}
        with torch.no_grad():
            for name, param in self.params:
                local_part(param).copy_(inputs.values[name]["param"])
                part = holder.get(param)
                if part is not None:
                    part.state.pop(param, None)
                    if name in held:
                        part.state[param] = {
                            key: value.clone() if isinstance(value, torch.Tensor) else value
                            for key, value in held[name].items()
                        }
            for cell_group, twin_group in zip(param_groups_of(self.optimizer), param_groups_of(self.twin)):
                twin_group["lr"] = cell_group["lr"]
            self.twin.step()
            twin = step_values(self.params, self.twin)
            for name, param in self.params:
                local_part(param).copy_(result.values[name]["param"])
        return twin


def params_of(optimizer) -> list:
    return [param for group in optimizer.param_groups for param in group["params"]]


def grouping_difference(params, optimizer, twin) -> str | None:
    """How the cell's param groups differ from the for-loop build's (which parameters, or a
    hyper-parameter but the LR), in a line; None when they agree."""
    cell_groups, twin_groups = param_groups_of(optimizer), param_groups_of(twin)
    names = {param: name for name, param in params}

    def grouping(groups):
        return [[names.get(param) for param in group["params"]] for group in groups]

    if grouping(cell_groups) != grouping(twin_groups):
        return "the cell's optimizer groups the parameters otherwise than the factory's for-loop build"
    for index, (cell_group, twin_group) in enumerate(zip(cell_groups, twin_groups)):
        for key in sorted(cell_group.keys() & twin_group.keys() - set(NOT_HYPERPARAMETERS)):
            if cell_group[key] != twin_group[key]:
                return (
                    f"param group {index} has {key}={cell_group[key]!r} in the cell's optimizer, "
                    f"{twin_group[key]!r} in the factory's for-loop build"
                )
    return None


def adamw_settings(params, optimizer, values: StepValues) -> dict[str, AdamWStep] | str:
    """Per parameter name, the AdamWStep its param group in `optimizer` sets at its step in `values`;
    or why there is none (a group without AdamW's hyper-parameters)."""
    names = {param: name for name, param in params}
    settings = {}
    for group in param_groups_of(optimizer):
        if missing := [key for key in ("betas", "eps", "weight_decay") if key not in group]:
            return f"the optimizer's param groups have no {', '.join(missing)}: not AdamW's update, no bound for it"
        for param in group["params"]:
            if param in names:
                settings[names[param]] = AdamWStep(
                    lr=float(group["lr"]),
                    beta1=float(group["betas"][0]),
                    beta2=float(group["betas"][1]),
                    eps=float(group["eps"]),
                    weight_decay=float(group["weight_decay"]),
                    step=int(values.steps.get(names[param], 0)),
                    dtype=str(param.dtype).removeprefix("torch."),
                )
    return settings


def compare_step(
    step: int,
    result: StepValues,
    reference: StepValues,
    inputs: StepValues,
    grads: dict[str, torch.Tensor],
    settings: dict[str, AdamWStep],
    sides: tuple[str, str],
) -> StepCheck:
    """One step's `result` against a `reference` step from the same `inputs` and `grads`: `step`
    exactly, the parameter and moments within the derived bound; the first parameter (in the model's
    order) and quantity that differs, its worst element and the likely cause. `sides` names the two."""
    worst_ratio, worst_abs, first = 0.0, 0.0, None
    subject, what = sides
    for name, setting in settings.items():
        if name not in grads:
            continue
        if result.steps.get(name) != reference.steps.get(name):
            worst_ratio = float("inf")
            first = first or (
                f"step {step}: step of {name} is {result.steps.get(name)} in the {subject}, {reference.steps.get(name)} "
                f"in the {what} (a step count of the implementation's own: counted twice, or kept apart from the state)"
            )
            continue
        values = inputs.values[name]
        p, g = values["param"], grads[name]
        m, v = (values.get(key, torch.zeros_like(p)) for key in MOMENTS)
        bounds = setting.bounds(p, g, m, v)
        for key in BOUNDED_KEYS:
            if key not in result.values[name] or key not in reference.values[name]:
                if key in result.values[name] or key in reference.values[name]:
                    first = first or f"step {step}: {key} of {name} is held by only one of the {subject} and the {what}"
                continue
            delta = result.values[name][key].double() - reference.values[name][key].double()
            ratio = torch.where(delta == 0, 0.0, (delta.abs() / bounds[key]).nan_to_num(nan=float("inf")))
            worst_ratio = max(worst_ratio, float(ratio.max()))
            worst_abs = max(worst_abs, float(delta.abs().max()))
            if first is None and float(ratio.max()) > 1:
                first = worst_element(step, name, key, delta, ratio, (result, reference), bounds[key], sides)
                if key == "param":
                    cause = likely_cause(delta, setting.exact(p, g, m, v)["update"], bounds["param"], setting, p, what)
                    first += f"\n    {cause}"
    bound = next(iter(settings.values())).describe() if settings else ""
    return StepCheck(step, first and f"{first}\n    bound: {bound}", worst_ratio, bound, worst_abs)


QUANTITY = {"param": "parameter", "exp_avg": "exp_avg (first moment)", "exp_avg_sq": "exp_avg_sq (second moment)"}


def worst_element(step, name, key, delta, ratio, both: tuple[StepValues, StepValues], bound, sides) -> str:
    """The line naming the quantity that differs, how many elements exceed the bound, and the worst one."""
    index = tuple(int(i) for i in torch.unravel_index(ratio.argmax(), ratio.shape)) if ratio.dim() else ()
    (subject, what), (result, reference) = sides, both
    return (
        f"step {step}: {QUANTITY[key]} of {name} differs beyond the bound in {int((ratio > 1).sum())} of "
        f"{ratio.numel()} elements; worst at {list(index)}: {subject} {float(result.values[name][key][index]):.9g}, "
        f"{what} {float(reference.values[name][key][index]):.9g}, |diff| {abs(float(delta[index])):.3e}, "
        f"bound {float(bound[index]):.3e} ({float(ratio[index]):.3g} x)"
    )


def likely_cause(delta, update, bound, setting: AdamWStep, param, what: str) -> str:
    """Which term of the step the parameter's difference follows over the elements that differ: one
    multiple of the parameter (another weight decay), or of the Adam `update` (a bias correction or
    the LR); neither points at the denominator, where eps matters for some elements only."""
    differing = delta.abs() > bound
    param = param.double()

    def fitted(term: torch.Tensor) -> float | None:
        """The factor c with delta = c * term on the differing elements, if it explains them."""
        scale = float((delta * term)[differing].sum() / (term * term)[differing].sum().clamp_min(1e-300))
        close = (delta - scale * term).abs() <= bound + CAUSE_SLACK * (scale * term).abs()
        return scale if float(close[differing].double().mean()) >= CAUSE_SHARE else None

    if (scale := fitted(param)) is not None:
        apart = abs(scale) / setting.lr
        left_out = abs(apart - setting.weight_decay) <= 1e-2 * setting.weight_decay
        return (
            f"cause: the difference is {scale:.3g} x the parameter: the two steps decay it as with weight decays "
            f"{apart:.3g} apart (its param group: weight_decay {setting.weight_decay:g})"
            + ("; one of them leaves the weight decay out" if left_out else "")
        )
    if (scale := fitted(update)) is not None:
        return (
            f"cause: the Adam update lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps) is {1 - scale:.6g} x the {what}'s "
            f"at step {setting.step}: a bias correction (or the learning rate) differs"
        )
    return (
        "cause: the difference is neither a multiple of the parameter (weight decay) nor of the Adam update (bias "
        "correction, LR): the denominator sqrt(v_hat) + eps differs (eps left out, inside the square root, or scaled)"
    )


def compare_with_kept(kept: KeptStep, other: KeptStep, step: int, sides: tuple[str, str]) -> StepCheck:
    """Another run's step from what should be the same state (a checkpoint loaded into another
    implementation) against the `kept` one: where it started from and its gradients bit for bit (a
    difference there is the load's or the forward's, not the update's), then the step within the bound."""
    subject, what = sides
    if isinstance(kept.settings, str):
        return StepCheck(step, None, 0.0, kept.settings)
    for name, values in kept.inputs.values.items():
        started = other.inputs.values.get(name, {})
        if other.inputs.steps.get(name) != kept.inputs.steps.get(name):
            return StepCheck(
                step,
                f"step {step}: the {subject} started from step {other.inputs.steps.get(name)} of {name}, "
                f"the {what} from {kept.inputs.steps.get(name)}",
                float("inf"),
                "",
            )
        for key, value in values.items():
            if key not in started or not torch.equal(started[key], value):
                return StepCheck(
                    step,
                    f"step {step}: the {subject} started from another {QUANTITY[key]} of {name} than the {what}",
                    float("inf"),
                    "",
                )
    for name, grad in kept.grads.items():
        if name not in other.grads or not torch.equal(other.grads[name], grad):
            return StepCheck(
                step,
                f"step {step}: the gradient of {name} in the {subject} differs from the {what}'s: the forward after "
                "the load is another one",
                float("inf"),
                "",
            )
    return compare_step(step, other.result, kept.result, kept.inputs, kept.grads, kept.settings, sides)
