"""A pip constraint the user's configuration sets (pip.conf's `constraint`, `PIP_CONSTRAINT`) that
refuses a torch version matrix.toml asks for, said in one line with how to lift it for one command.

Company pip configurations often cap torch (`torch<=2.14.1`); pip then refuses a newer pin with
"conflicting dependencies", naming the constraint but not where it comes from.
"""

from __future__ import annotations

import re

CONSTRAINT_LINE = re.compile(r"^\s*The user requested \(constraint\) (\S.*?)\s*$", re.M)
CONFIGURED = re.compile(r"^(global|install|:env:)\.constraint='(.*)'$", re.M)
LIFT = "PIP_CONSTRAINT=/dev/null"


def configured_constraint(pip_config_list: str) -> str:
    """Where the configured constraint comes from, in words (`pip config list` output: `:env:`
    entries are PIP_* variables, which win over the files); "" when none is configured."""
    found = dict(CONFIGURED.findall(pip_config_list))
    if ":env:" in found:
        return f"PIP_CONSTRAINT={found[':env:']}"
    for section in ("install", "global"):
        if section in found:
            return f"{found[section]}, named by `{section}.constraint` in a pip.conf (`pip config debug` shows which)"
    return ""


def blocking_constraint(version: str, installer_output: str, pip_config_list: str, own: tuple[str, ...]) -> str:
    """The one-line reason when a constraint of the user's pip configuration refused torch==version
    in `installer_output` (pip's "The user requested (constraint) ..." lines), else ""; a constraint
    matrix.toml itself gives (`own`) is left to pip's own message."""
    configured = configured_constraint(pip_config_list)
    refusing = [c for c in CONSTRAINT_LINE.findall(installer_output) if c not in own]
    if not configured or not refusing:
        return ""
    torch_first = sorted(refusing, key=lambda c: not c.lower().startswith("torch"))
    return (
        f"torch=={version} is refused by the pip constraint {torch_first[0]} from {configured}; "
        f"to install it for one command, prefix that command with {LIFT} (e.g. {LIFT} nox -s gpu_matrix)"
    )
