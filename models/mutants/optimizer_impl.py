"""Known-bad optimizer implementations for the resume suite's implementation checks: each factory
builds the reference AdamW (torchmatrix.models.optim.build_adamw) for every `optimizer_impl` but
the one it breaks, so loads into the other implementations compare the broken one with the reference.

The compiled ones compile with dynamo's `eager` backend: what they break is in their own load or
step, not in the compiler, so a CI cell of theirs pays no Inductor compile.
"""

from __future__ import annotations

from functools import partial

import torch

from ..optim import CompiledStepAdamW, adamw_as_torch_builds_it, build_adamw, keeps_its_implementation

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
