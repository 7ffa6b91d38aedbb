"""Optimizer factories for the `optimizer` axis.

Every factory has the signature ``factory(params, *, lr, betas=(0.9, 0.999), eps=1e-8,
weight_decay=0.0) -> torch.optim.Optimizer`` so a suite can build any of them the same way
(build_adamw_no_decay_on_norms also takes the protocol's optional ``named_parameters``);
matrix.toml names them as components ``optimizer_<axis value>``.
"""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor


def build_adamw(params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0) -> torch.optim.AdamW:
    """torch.optim.AdamW as production runs it: the fused kernel where this torch supports it
    on the params' device, the foreach implementation otherwise."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)
    except RuntimeError:
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=True)


def build_adamw_no_decay_on_norms(
    params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, named_parameters=None
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
    return build_adamw(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def _in_a_norm(name: str) -> bool:
    """Whether a parameter belongs to a norm layer, as its module's name (`layers.0.attn_norm`) says."""
    return "norm" in name.rpartition(".")[0].rpartition(".")[2]


def build_precision_aware(
    params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, moment_dtype=torch.bfloat16
) -> PrecisionAwareAdamW:
    """PrecisionAwareAdamW; the suites give it bf16 params, as a mixed-precision stack does."""
    return PrecisionAwareAdamW(
        params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, moment_dtype=moment_dtype
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
