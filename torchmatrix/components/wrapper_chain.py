"""What wraps the user's model: a trainer's module (Lightning Fabric's `_FabricModule`), torch.compile's
`OptimizedModule`, DDP and FSDP1, in any order and at any depth. The one place the suites ask where
the user's model sits, which data-parallel wrapper holds it and how a name reads below the wrappers,
so FSDP1 under Fabric's wrapper is gathered, clipped and saved as FSDP1, not as the local shards the
module beneath it holds. torch is imported only when a model is walked: torchmatrix loads without it."""

from __future__ import annotations

from torchmatrix.components.parameter_names import clean_name

HOLDING_SLOTS = ("_forward_module", "_orig_mod")
"""Where a wrapper keeps the module it calls: Fabric's `_FabricModule` (its `_original_module` may sit
beside it, the same model unwrapped) and torch.compile's `OptimizedModule`. accelerate's `prepare`
wraps in DDP, FSDP1 or OptimizedModule, or shards with FSDP2 in place, so it needs no slot of its own."""


def held_slot(module) -> str | None:
    """The name of the child `module` wraps and calls (FSDP1's `_fsdp_wrapped_module`, DDP's `module`,
    a slot of HOLDING_SLOTS), or None when `module` is no wrapper."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(module, FullyShardedDataParallel):
        return "_fsdp_wrapped_module"
    if isinstance(module, DistributedDataParallel):
        return "module"
    return next((slot for slot in HOLDING_SLOTS if module._modules.get(slot) is not None), None)


def wrapper_chain(model) -> list:
    """`model`, then each module the one before it wraps: the user's model last."""
    chain = [model]
    while (slot := held_slot(chain[-1])) is not None:
        chain.append(chain[-1]._modules[slot])
    return chain


def user_model(model):
    """The module the wrappers hold at the bottom: the model the `model` component built, as
    `parallelize` left it (sharded in place by FSDP2, its blocks compiled or checkpoint-wrapped)."""
    return wrapper_chain(model)[-1]


def fsdp1_root(model):
    """The outermost FSDP1 module of the chain, the root its collectives (summon_full_params,
    clip_grad_norm_, state dicts) must be called on; None when no FSDP1 wraps the user's model."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return next((module for module in wrapper_chain(model) if isinstance(module, FullyShardedDataParallel)), None)


def state_dict_root(model):
    """The module to hand torch's state-dict helpers (get_model_state_dict, ...): FSDP1's root, whose
    state dicts gather or shard as asked under the user's names, else the user's model itself: a
    trainer's wrapper, DDP and OptimizedModule would only prefix its names (Fabric's `state_dict`
    even skips FSDP1, reading the local shards of the module beneath it)."""
    return fsdp1_root(model) or user_model(model)


def name_below_wrappers(model, name: str) -> str:
    """`name` (a dotted path in `model`) as the user's model spells it: the wrappers' slots it starts
    with dropped (`_forward_module.`, `_orig_mod.`, `module.`), then the prefixes that checkpoint
    wrappers, FSDP1 units and compiled blocks insert further down."""
    parts = name.split(".") if name else []
    for module in wrapper_chain(model)[:-1]:
        if not parts or parts[0] != held_slot(module):
            break
        parts = parts[1:]
    return clean_name(".".join(parts))
