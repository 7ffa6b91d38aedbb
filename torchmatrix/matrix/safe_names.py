"""Values that become file and directory names: run ids, torch pins, cell ids, suite names.

They come from the command line, the environment and files another job wrote (plan.json, event
logs), so each is checked where it is read: none may lead outside the reports directory.
"""

from __future__ import annotations

import re

from torchmatrix.user_error import UserError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


class UnsafeName(UserError, ValueError):
    """A value that would become a path but could leave its directory; the message says what to use."""


def check_name(value: object, what: str) -> str:
    """`value` as one file name: letters, digits, `_ . + -`, starting with a letter or digit."""
    if not isinstance(value, str) or not NAME.match(value):
        raise UnsafeName(
            f"{what} {value!r} cannot be a file name; use letters, digits, '_', '.', '+' and '-', starting with a letter or digit"
        )
    return value


def check_relative_path(value: object, what: str) -> str:
    """`value` as a relative path of such names (`slurm-1/cells-3`), never absolute or with `..`."""
    if not isinstance(value, str) or not value:
        raise UnsafeName(f"{what} {value!r} is empty or not text; pass a name such as run-1")
    for part in value.split("/"):
        if not NAME.match(part):
            raise UnsafeName(
                f"{what} {value!r} would leave the reports directory or is not a plain name; use names of letters, digits, '_', '.', '+' and '-' joined by '/'"
            )
    return value
