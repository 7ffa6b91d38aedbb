"""Parameter names as the user's model spells them, whatever wrapper the cell put around it."""

from __future__ import annotations

WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
"""What FSDP1, activation-checkpoint wrappers and torch.compile insert into `named_parameters()`."""


def clean_name(name: str) -> str:
    """A parameter's name without the prefixes of FSDP1, checkpoint wrappers and torch.compile."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name
