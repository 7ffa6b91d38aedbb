"""Optimizer factories for the `optimizer` axis.

Every factory has the signature ``factory(params, *, lr, betas=(0.9, 0.999), eps=1e-8,
weight_decay=0.0, implementation="default") -> torch.optim.Optimizer`` so a suite can build any
of them the same way (build_adamw_no_decay_on_norms also takes the protocol's optional
``named_parameters``); matrix.toml names them as components ``optimizer_<axis value>``, and the
cell's `optimizer_impl` arrives as ``implementation``.
"""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor

from torchmatrix.testing import DEFAULT_IMPLEMENTATION, IMPLEMENTATIONS, UnavailableImplementation

ADAMW_FLAGS = {"forloop": {"foreach": False, "fused": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
"""torch.optim.AdamW's keywords for each kernel implementation; `compiled` is CompiledStepAdamW."""
KERNEL_FLAGS = ("foreach", "fused", "capturable")
"""The param-group entries that choose torch's kernels, and which torch's load_state_dict overwrites."""


def build_adamw(
    params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, implementation=DEFAULT_IMPLEMENTATION
) -> torch.optim.AdamW:
    """torch.optim.AdamW in the cell's implementation, which it keeps across a load
    (keeps_its_implementation): `default` as production runs it (the fused kernel where this torch
    supports it on the params' device, foreach otherwise), or the one `implementation` names."""
    return keeps_its_implementation(
        adamw_as_torch_builds_it(params, implementation, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    )


def adamw_as_torch_builds_it(params, implementation: str, **hyperparameters) -> torch.optim.AdamW:
    """torch.optim.AdamW (or CompiledStepAdamW) in `implementation`, with torch's own load, which
    takes the kernel flags from the checkpoint; UnavailableImplementation for fused kernels this torch
    lacks for these params."""
    params = list(params)
    if implementation == DEFAULT_IMPLEMENTATION:
        try:
            return torch.optim.AdamW(params, **hyperparameters, fused=True)
        except RuntimeError:
            return torch.optim.AdamW(params, **hyperparameters, foreach=True)
    if implementation == "compiled":
        return CompiledStepAdamW(params, **hyperparameters)
    if implementation not in ADAMW_FLAGS:
        raise ValueError(f"optimizer_impl={implementation!r}: expected one of {', '.join(IMPLEMENTATIONS)}")
    if implementation == "fused" and (reason := fused_unavailable(params)):
        raise UnavailableImplementation(reason)
    return torch.optim.AdamW(params, **hyperparameters, **ADAMW_FLAGS[implementation])


def fused_unavailable(params) -> str | None:
    """Why torch's fused AdamW cannot run on these params here, in torch's own words where it has
    them (its device and dtype check); None when it can."""
    tensors = param_tensors(params)
    if any(p.device.type == "cpu" for p in tensors) and torch.__version__ < (2, 4):
        return f"fused AdamW on CPU exists from torch 2.4; this is torch {torch.__version__}"
    from torch.optim import optimizer

    device_dtype_check = getattr(optimizer, "_device_dtype_check_for_fused", None)
    for param in tensors if device_dtype_check else ():
        try:
            device_dtype_check(param)
        except RuntimeError as error:
            return f"fused AdamW: {error}"
    return None


def param_tensors(params) -> list[torch.Tensor]:
    """The tensors of an optimizer's `params` argument, whether it lists tensors or param groups."""
    return [p for item in params for p in (item["params"] if isinstance(item, dict) else [item])]


class CompiledStepAdamW(torch.optim.AdamW):
    """torch.optim.AdamW whose `step` runs through `torch.compile`, as torch's compiled-optimizer
    recipe has it: inside the step the LR is a tensor (float64, so a Python float round-trips
    exactly), so the scheduler changing it does not recompile the step. Unlike the recipe, the param
    groups hold the LR as a float outside the step: a tensor LR there goes into the state dicts of
    the optimizer and of its LR scheduler (`base_lrs`), which DCP keys apart from floats, so a
    checkpoint of this implementation and one of an eager one would not load into each other. The
    kernels under the compile are the device's default (single-tensor on CPU, foreach on CUDA); it
    is still a torch.optim.Optimizer, which DCP's state-dict helpers and the suites need. It is built
    `capturable` where Dynamo's first compiled step would switch that on (every param on CUDA or
    XPU), so the flags keeps_its_implementation restores after a load are the ones the step ran with."""

    def __init__(self, params, *, lr, backend: str = "inductor", **hyperparameters):
        params = list(params)
        capturable = all(p.is_cuda or p.is_xpu for p in param_tensors(params))
        super().__init__(params, lr=lr, capturable=capturable, **hyperparameters)
        self._compiled_step = compiled_with_tensor_lr(self, super().step, backend)

    def step(self, closure=None):
        return self._compiled_step(closure)


def compiled_with_tensor_lr(optimizer: torch.optim.Optimizer, step, backend: str):
    """`step` under torch.compile, called with each of `optimizer`'s param groups' LR swapped for a
    float64 tensor of its own (the same tensor every call, so a new LR value is a new tensor value,
    not a recompile) and put back afterwards."""
    compiled = torch.compile(step, backend=backend)
    lr_tensors = [torch.zeros((), dtype=torch.float64) for _ in optimizer.param_groups]

    def step_with_tensor_lr(closure=None):
        groups = optimizer.param_groups
        lrs = [group["lr"] for group in groups]
        for group, lr, tensor in zip(groups, lrs, lr_tensors):
            group["lr"] = tensor.fill_(lr)
        try:
            return compiled(closure)
        finally:
            for group, lr in zip(groups, lrs):
                group["lr"] = lr

    return step_with_tensor_lr


def keeps_its_implementation(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """`optimizer`, staying the implementation it was built as across a load. torch's
    `load_state_dict` takes each param group's `foreach`, `fused` and `capturable` from the
    checkpoint, so a fused optimizer that loads a foreach checkpoint runs foreach from then on;
    after a load this puts the built flags back, and `step` where this implementation keeps it
    (fp32 on the param's device for fused and capturable kernels, on the CPU otherwise)."""
    built = [{flag: group[flag] for flag in KERNEL_FLAGS if flag in group} for group in optimizer.param_groups]

    def restore_implementation(optimizer) -> None:
        for group, flags in zip(optimizer.param_groups, built):
            group.update(flags)
            on_param_device = group.get("fused") or group.get("capturable")
            for param in group["params"]:
                state = optimizer.state.get(param, {})
                if isinstance(state.get("step"), torch.Tensor):
                    step = state["step"]
                    state["step"] = step.to(param.device, torch.float32) if on_param_device else step.to("cpu")

    optimizer.register_load_state_dict_post_hook(restore_implementation)
    return optimizer


def build_adamw_no_decay_on_norms(
    params,
    *,
    lr,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.0,
    named_parameters=None,
    implementation=DEFAULT_IMPLEMENTATION,
) -> torch.optim.AdamW:
    """build_adamw with param groups chosen by name, as production recipes set them up: the norms'
    weights without weight decay, every other param with it. It needs the names, so it takes the
    protocol's optional `named_parameters` (wrapper prefixes already removed)."""
    if named_parameters is None:
        raise TypeError("build_adamw_no_decay_on_norms groups params by name: pass named_parameters")
    groups = [
        {"params": [param for name, param in named_parameters if not _in_a_norm(name)], "weight_decay": weight_decay},
        {"params": [param for name, param in named_parameters if _in_a_norm(name)], "weight_decay": 0.0},
    ]
    return build_adamw(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, implementation=implementation)


def _in_a_norm(name: str) -> bool:
    """Whether a parameter belongs to a norm layer, as its module's name (`layers.0.attn_norm`) says."""
    return "norm" in name.rpartition(".")[0].rpartition(".")[2]


def build_precision_aware(
    params,
    *,
    lr,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.0,
    moment_dtype=torch.bfloat16,
    implementation=DEFAULT_IMPLEMENTATION,
) -> PrecisionAwareAdamW:
    """PrecisionAwareAdamW; the suites give it bf16 params, as a mixed-precision stack does. It has
    one implementation, `default`; see PRECISION_AWARE_IMPLEMENTATIONS for why not the others."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"optimizer_impl={implementation!r}: expected one of {', '.join(IMPLEMENTATIONS)}")
    if implementation != DEFAULT_IMPLEMENTATION:
        raise UnavailableImplementation(f"optimizer_impl={implementation}: {PRECISION_AWARE_IMPLEMENTATIONS}")
    return PrecisionAwareAdamW(
        params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, moment_dtype=moment_dtype
    )


PRECISION_AWARE_IMPLEMENTATIONS = (
    "PrecisionAwareAdamW has one implementation, its own per-parameter loop (`default`): torch has no "
    "foreach or fused kernel for an fp32 master with low-precision moments, and torch.compile of its step "
    "breaks the graph at every parameter's `step.item()` and recompiles per lazily created state until the "
    "recompile limit makes it eager again, so a `compiled` cell would run the same eager loop"
)


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The shard this rank holds: the local tensor of a DTensor, the tensor itself otherwise."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class PrecisionAwareAdamW(torch.optim.Optimizer):
    """AdamW for low-precision params: an fp32 master copy of every param, moments
    (exp_avg, exp_avg_sq) stored in `moment_dtype`, the update computed in fp32 and the
    master written back into the param.

    State is created lazily on a param's first step, like torch.optim.AdamW and
    TransformerEngine's FusedAdam, which is what makes a naive checkpoint load lose it. For a
    DTensor param every state tensor except the scalar `step` is a DTensor with the param's
    mesh, placements, global shape and stride; the update itself runs on the local shards.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, moment_dtype=torch.bfloat16):
        if not moment_dtype.is_floating_point:
            raise ValueError(f"moment_dtype must be a floating-point dtype, got {moment_dtype}")
        self.moment_dtype = moment_dtype
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW step for every param that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group)
        return loss

    def _update(self, param: torch.Tensor, group: dict) -> None:
        """Decoupled weight decay and the bias-corrected Adam step, on the fp32 master."""
        lr, (beta1, beta2), eps, weight_decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        state = self.state[param]
        if not state:
            state.update(self._initial_state(param))
        state["step"] += 1
        step = state["step"].item()

        grad = param.grad
        if isinstance(grad, DTensor) and grad.placements != param.placements:
            grad = grad.redistribute(param.device_mesh, param.placements)
        grad = local_tensor(grad).float()
        master = local_tensor(state["master"])
        exp_avg = local_tensor(state["exp_avg"])
        exp_avg_sq = local_tensor(state["exp_avg_sq"])

        master.mul_(1 - lr * weight_decay)
        exp_avg_fp32 = exp_avg.float().lerp_(grad, 1 - beta1)
        exp_avg_sq_fp32 = exp_avg_sq.float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        denom = (exp_avg_sq_fp32.sqrt() / math.sqrt(bias_correction2)).add_(eps)
        master.addcdiv_(exp_avg_fp32, denom, value=-lr / bias_correction1)

        exp_avg.copy_(exp_avg_fp32)
        exp_avg_sq.copy_(exp_avg_sq_fp32)
        local_tensor(param).copy_(master)

    def _initial_state(self, param: torch.Tensor) -> dict:
        """Step counter, fp32 master copied from the param, zero moments in `moment_dtype`."""
        shard = local_tensor(param).detach()
        return {
            "step": torch.tensor(0.0, dtype=torch.float32),
            "master": _shaped_like(param, shard.to(torch.float32, copy=True)),
            "exp_avg": _shaped_like(param, torch.zeros_like(shard, dtype=self.moment_dtype)),
            "exp_avg_sq": _shaped_like(param, torch.zeros_like(shard, dtype=self.moment_dtype)),
        }

    def state_dict(self) -> dict:
        """torch's state dict with every floating state tensor widened to fp32, as
        TransformerEngine's FusedAdam does: lossless, and FSDP1's optimizer state dict (with
        use_orig_params) requires all state tensors of one parameter to share a dtype."""
        state_dict = super().state_dict()
        state_dict["state"] = {
            param_id: {key: _widened(value) for key, value in state.items()}
            for param_id, state in state_dict["state"].items()
        }
        return state_dict

    def load_state_dict(self, state_dict: dict) -> None:
        """Load param groups as torch does, but put the state back in this optimizer's own
        dtypes (fp32 master, `moment_dtype` moments): torch's default casts floating state to
        the param dtype, which would round the fp32 master to bf16."""
        super().load_state_dict({**state_dict, "state": {}})
        saved_ids = [param_id for group in state_dict["param_groups"] for param_id in group["params"]]
        params = [param for group in self.param_groups for param in group["params"]]
        for param_id, param in zip(saved_ids, params):
            if param_id in state_dict["state"]:
                self.state[param] = {
                    key: self._loaded_state_value(param, key, value)
                    for key, value in state_dict["state"][param_id].items()
                }

    def _loaded_state_value(self, param: torch.Tensor, key: str, value):
        """A private copy of a loaded state value in the dtype this optimizer keeps it in, on the
        param's device; `step` stays a CPU scalar so reading it never synchronises the device."""
        if not isinstance(value, torch.Tensor):
            return value
        if key == "step":
            return value.to(device="cpu", dtype=torch.float32, copy=True)
        dtype = torch.float32 if key == "master" else self.moment_dtype
        return value.to(device=param.device, dtype=dtype, copy=True)


def _shaped_like(param: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
    """Wrap a local state shard as a DTensor laid out exactly like `param`; plain params get `shard`."""
    if not isinstance(param, DTensor):
        return shard
    return DTensor.from_local(
        shard, param.device_mesh, param.placements, shape=param.shape, stride=param.stride(), run_check=False
    )


def _widened(value):
    """Floating tensors as fp32 (the same tensor when already fp32); anything else unchanged."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.float()
    return value
