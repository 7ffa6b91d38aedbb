"""Known-bad optimizer implementations for the resume suite's implementation checks: each factory
builds the reference AdamW (torchmatrix.models.optim.build_adamw) for every `optimizer_impl` but
the one it breaks, so loads into the other implementations compare the broken one with the reference.

The compiled ones compile with dynamo's `eager` backend: what they break is in their own load or
step, not in the compiler, so a CI cell of theirs pays no Inductor compile.

The update mutants (HandWrittenAdamW's subclasses, FirstGroupBucketedAdamW) break the step's
arithmetic and are consistent with themselves: straight and resumed runs agree and their checkpoints
load anywhere, so only a comparison with another implementation's step shows them (the for-loop twin
of suites/references/optimizer_twin.py, and the step after a load into another implementation). They are written
from issue 56's classes: weight decay skipped for some parameters, a step count of the
implementation's own, another bias correction, eps elsewhere in the denominator. BucketedFusedAdamW
is the valid control: torch's fused kernel per bucket with each group's hyper-parameters.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch.optim.adam import adam

from ..optim import CompiledStepAdamW, _in_a_norm, adamw_as_torch_builds_it, build_adamw, keeps_its_implementation

MUTANT_BACKEND = "eager"


class StepRecastOnLoadAdamW(CompiledStepAdamW):
    """pytorch#173901's class, at the load: a compiled optimizer whose `load_state_dict` puts every
    `step` in another dtype than the one saved (float64 here; the real one forced float32 on a step
    its user kept in float64), so bias correction after the resume runs on other numbers."""

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        for state in self.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].to(torch.float64)


class StepRecastAfterLoadAdamW(CompiledStepAdamW):
    """pytorch#173901's class, in the step: the load restores `step` as saved, but the first compiled
    step after a load casts every `step` to float64 before stepping, so right after the load all
    looks restored and only the state after the resumed steps (and the update) differs."""

    def __init__(self, params, **hyperparameters):
        super().__init__(params, **hyperparameters)
        loads = []
        self.register_load_state_dict_post_hook(lambda optimizer: loads.append(optimizer))
        compiled_step = self._compiled_step

        def step_recasting_after_a_load(closure=None):
            if loads:
                loads.clear()
                for state in self.state.values():
                    if isinstance(state.get("step"), torch.Tensor):
                        state["step"] = state["step"].to(torch.float64)
            return compiled_step(closure)

        self._compiled_step = step_recasting_after_a_load


class OneElementStepAdamW(torch.optim.AdamW):
    """pytorch#108860's class: a fused AdamW whose state dict holds `step` as a one-element tensor
    (shape (1,)) where every other implementation holds a scalar. Its own checkpoints round-trip
    (its load reshapes back); another implementation cannot load them, nor it theirs."""

    def state_dict(self) -> dict:
        state_dict = super().state_dict()
        state_dict["state"] = {index: _step_reshaped(state, (1,)) for index, state in state_dict["state"].items()}
        return state_dict

    def load_state_dict(self, state_dict: dict) -> None:
        state = {index: _step_reshaped(entries, ()) for index, entries in state_dict["state"].items()}
        super().load_state_dict({**state_dict, "state": state})


def _step_reshaped(state: dict, shape: tuple) -> dict:
    return {key: value.reshape(shape) if key == "step" else value for key, value in state.items()}


def build_adamw_taking_checkpoint_kernels(
    params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, implementation="default"
) -> torch.optim.AdamW:
    """torch.optim.AdamW in every implementation as torch builds it, without the reference's
    keeps_its_implementation: its load takes the checkpoint's `foreach` / `fused` flags, so an
    optimizer built fused that loads a forloop checkpoint runs forloop from then on (the resumed run
    silently changes kernels, and a stack that switched to fused never gets it from old checkpoints)."""
    return adamw_as_torch_builds_it(params, implementation, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


class DTensorRefusingForeachAdamW(torch.optim.AdamW):
    """The break of torch versions whose foreach kernels did not take DTensor params (stacks set
    `foreach=False` under FSDP2): a foreach AdamW whose step raises on DTensor params. A cell of it
    must fail with that error, never skip as if the implementation were merely unavailable."""

    def step(self, closure=None):
        from torch.distributed.tensor import DTensor

        if any(isinstance(p, DTensor) for group in self.param_groups for p in group["params"]):
            raise RuntimeError("foreach AdamW: DTensor params are not supported by the foreach kernels")
        return super().step(closure)


def reference_but(target: str, build_mutant):
    """An optimizer factory that builds `build_mutant(params, **hyperparameters)`, kept in its kernels
    across a load, for the `target` implementation, and the reference AdamW for every other."""

    def build(params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, implementation="default"):
        hyperparameters = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        if implementation != target:
            return build_adamw(params, **hyperparameters, implementation=implementation)
        return keeps_its_implementation(build_mutant(params, **hyperparameters))

    return build


build_step_recast_on_load = reference_but("compiled", partial(StepRecastOnLoadAdamW, backend=MUTANT_BACKEND))
build_step_recast_after_load = reference_but("compiled", partial(StepRecastAfterLoadAdamW, backend=MUTANT_BACKEND))
build_one_element_step = reference_but("fused", partial(OneElementStepAdamW, fused=True))
build_foreach_refusing_dtensors = reference_but("foreach", partial(DTensorRefusingForeachAdamW, foreach=True))


class HandWrittenAdamW(torch.optim.AdamW):
    """AdamW's decoupled update, per parameter, as torch's for-loop computes it; its state is torch's
    (a float32 CPU `step`, `exp_avg`, `exp_avg_sq`), so checkpoints load into and from torch's."""

    def __init__(self, params, **hyperparameters):
        super().__init__(params, foreach=False, fused=False, **hyperparameters)

    @torch.no_grad()
    def step(self, closure=None):
        for index, group in enumerate(self.param_groups):
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                step = self.count(state)
                param.mul_(1 - group["lr"] * self.weight_decay(group, index, param))
                state["exp_avg"].lerp_(param.grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(param.grad, param.grad, value=1 - beta2)
                bias_correction1, bias_correction2_sqrt = self.bias_corrections(beta1, beta2, step)
                denominator = self.denominator(state["exp_avg_sq"], bias_correction2_sqrt, group["eps"])
                param.addcdiv_(state["exp_avg"], denominator, value=-group["lr"] / bias_correction1)

    def count(self, state: dict) -> float:
        """Advance the parameter's `step` and return the step number the bias corrections use."""
        state["step"] += 1
        return float(state["step"])

    def weight_decay(self, group: dict, index: int, param: torch.Tensor) -> float:
        return group["weight_decay"]

    def bias_corrections(self, beta1: float, beta2: float, step: float) -> tuple[float, float]:
        """1 - beta1**step, and the square root of 1 - beta2**step."""
        return 1 - beta1**step, math.sqrt(1 - beta2**step)

    def denominator(self, exp_avg_sq: torch.Tensor, bias_correction2_sqrt: float, eps: float) -> torch.Tensor:
        return (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)


class NoDecayOnVectorsAdamW(HandWrittenAdamW):
    """Weight decay skipped for 1-D parameters (norm weights, biases): a no-decay rule one
    implementation applies on its own, where the factory's param groups decay them."""

    def weight_decay(self, group, index, param):
        return 0.0 if param.dim() == 1 else group["weight_decay"]


class NoDecayAfterFirstGroupAdamW(HandWrittenAdamW):
    """Weight decay applied to the first param group only (a step that keeps the decay of one group):
    under grouped_by_shape's factory, which decays both groups, the vectors go undecayed."""

    def weight_decay(self, group, index, param):
        return group["weight_decay"] if index == 0 else 0.0


class DoubleCountingAdamW(HandWrittenAdamW):
    """`step` advanced twice per step (a wrapper and the inner step both count), bias corrections
    from that count: consistent across a resume, the bias corrections end too early."""

    def count(self, state):
        state["step"] += 2
        return float(state["step"])


class OwnStepCounterAdamW(HandWrittenAdamW):
    """Bias corrections from a counter of the optimizer's own, outside its state dict, while the
    state's `step` advances as torch's: after a load into it the counter starts again from one."""

    def __init__(self, params, **hyperparameters):
        super().__init__(params, **hyperparameters)
        self.steps_taken: dict[int, int] = {}

    def count(self, state):
        state["step"] += 1
        key = id(state)
        self.steps_taken[key] = self.steps_taken.get(key, 0) + 1
        return float(self.steps_taken[key])


class UnrootedBiasCorrectionAdamW(HandWrittenAdamW):
    """The second moment's bias correction 1 - beta2**step without its square root."""

    def bias_corrections(self, beta1, beta2, step):
        return 1 - beta1**step, 1 - beta2**step


class StepAheadBiasCorrectionAdamW(HandWrittenAdamW):
    """Bias corrections one step ahead (step + 1: counted before the increment, then corrected the wrong way)."""

    def bias_corrections(self, beta1, beta2, step):
        return super().bias_corrections(beta1, beta2, step + 1)


class EpsInsideSqrtAdamW(HandWrittenAdamW):
    """eps inside the square root: sqrt(v_hat + eps), so eps weighs as sqrt(eps) = 1e-4."""

    def denominator(self, exp_avg_sq, bias_correction2_sqrt, eps):
        return (exp_avg_sq / bias_correction2_sqrt**2).add_(eps).sqrt_()


class EpsBeforeBiasCorrectionAdamW(HandWrittenAdamW):
    """eps added before the bias correction, (sqrt(v) + eps) / sqrt(bc2): eps scaled by 1 / sqrt(bc2)."""

    def denominator(self, exp_avg_sq, bias_correction2_sqrt, eps):
        return exp_avg_sq.sqrt().add_(eps).div_(bias_correction2_sqrt)


class BucketedFusedAdamW(torch.optim.AdamW):
    """The valid control: the params stepped in buckets of `bucket_size` through torch's fused AdamW
    kernel (torch.optim.adam.adam, fused=True), each bucket with its group's hyper-parameters."""

    bucket_size = 3

    def __init__(self, params, **hyperparameters):
        super().__init__(params, foreach=False, fused=False, **hyperparameters)

    def hyperparameters(self, group: dict) -> dict:
        beta1, beta2 = group["betas"]
        return dict(beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"])

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            params = [param for param in group["params"] if param.grad is not None]
            for start in range(0, len(params), self.bucket_size):
                bucket = params[start : start + self.bucket_size]
                states = [self.initialised(param) for param in bucket]
                adam(
                    bucket,
                    [param.grad for param in bucket],
                    [state["exp_avg"] for state in states],
                    [state["exp_avg_sq"] for state in states],
                    [],
                    [state["step"] for state in states],
                    fused=True,
                    decoupled_weight_decay=True,
                    amsgrad=False,
                    maximize=False,
                    **self.hyperparameters(group),
                )

    def initialised(self, param: torch.Tensor) -> dict:
        state = self.state[param]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        return state


class FirstGroupBucketedAdamW(BucketedFusedAdamW):
    """Buckets stepped with the first param group's hyper-parameters whatever group they hold: the
    norms' group of build_adamw_no_decay_on_norms is then decayed like the rest."""

    def hyperparameters(self, group):
        return super().hyperparameters(self.param_groups[0])


def grouped(split):
    """An optimizer factory over two param groups chosen by `split(name, param)`, both with the
    factory's weight decay unless the split says otherwise, that builds `mutant` for the `target`
    implementation and the reference (build_adamw) for every other."""

    def factory(target: str, mutant):
        def build(
            params,
            *,
            lr,
            betas=(0.9, 0.999),
            eps=1e-8,
            weight_decay=0.0,
            named_parameters=None,
            implementation="default",
        ):
            groups = split(named_parameters, weight_decay)
            hyperparameters = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
            if implementation != target:
                return build_adamw(groups, **hyperparameters, implementation=implementation)
            return keeps_its_implementation(mutant(groups, **hyperparameters))

        return build

    return factory


def _by_shape(named_parameters, weight_decay):
    """Matrices, then vectors, both decayed."""
    return [
        {"params": [param for _, param in named_parameters if param.dim() > 1], "weight_decay": weight_decay},
        {"params": [param for _, param in named_parameters if param.dim() <= 1], "weight_decay": weight_decay},
    ]


def _norms_undecayed(named_parameters, weight_decay):
    """As build_adamw_no_decay_on_norms: the norms' weights in a group of their own without weight decay."""
    return [
        {"params": [param for name, param in named_parameters if not _in_a_norm(name)], "weight_decay": weight_decay},
        {"params": [param for name, param in named_parameters if _in_a_norm(name)], "weight_decay": 0.0},
    ]


grouped_by_shape = grouped(_by_shape)
grouped_norms_undecayed = grouped(_norms_undecayed)

build_hand_written = reference_but("fused", HandWrittenAdamW)
build_no_decay_on_vectors = reference_but("fused", NoDecayOnVectorsAdamW)
build_no_decay_after_first_group = grouped_by_shape("fused", NoDecayAfterFirstGroupAdamW)
build_double_counting = reference_but("fused", DoubleCountingAdamW)
build_own_step_counter = reference_but("fused", OwnStepCounterAdamW)
build_unrooted_bias_correction = reference_but("fused", UnrootedBiasCorrectionAdamW)
build_step_ahead_bias_correction = reference_but("fused", StepAheadBiasCorrectionAdamW)
build_eps_inside_sqrt = reference_but("fused", EpsInsideSqrtAdamW)
build_eps_before_bias_correction = reference_but("fused", EpsBeforeBiasCorrectionAdamW)
build_bucketed_fused = grouped_norms_undecayed("fused", BucketedFusedAdamW)
build_first_group_bucketed = grouped_norms_undecayed("fused", FirstGroupBucketedAdamW)
