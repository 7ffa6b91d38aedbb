"""Parameter names as the user's model spells them, whatever wrapper the cell put around it."""

from __future__ import annotations

FSDP_NAME_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def clean_name(name: str) -> str:
    """A parameter's name without FSDP1/checkpoint-wrapper prefixes."""
    for prefix in FSDP_NAME_PREFIXES:
        name = name.replace(prefix, "")
    return name
