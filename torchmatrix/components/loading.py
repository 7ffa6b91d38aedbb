"""Components are named by import path ("package.module:attribute") so that a user points
the suites at their own model, optimizer or checkpointer by editing matrix.toml."""

from __future__ import annotations

import importlib
import re

IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def load(import_path: str):
    """Resolve "package.module:attribute" (attribute may be dotted) to the object it names."""
    if not IMPORT_PATH.match(import_path):
        raise ValueError(f"{import_path!r} is not an import path of the form 'package.module:attribute'")
    module_name, _, attribute = import_path.partition(":")
    obj = importlib.import_module(module_name)
    for part in attribute.split("."):
        obj = getattr(obj, part)
    return obj
