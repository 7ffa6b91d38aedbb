"""MkDocs hook: a page line `<!-- generated: package.module:function -->` becomes the markdown that
function returns, so every reference table is rendered from the code that owns it at each build."""

from __future__ import annotations

import importlib
import re

MARKER = re.compile(r"^<!-- generated: (?P<module>[\w.]+):(?P<function>\w+) -->$", re.MULTILINE)


def expand(markdown: str) -> str:
    """The page with each marker replaced; an unknown module or function fails the build."""
    return MARKER.sub(lambda m: getattr(importlib.import_module(m["module"]), m["function"])(), markdown)


def on_page_markdown(markdown: str, **_) -> str:
    return expand(markdown)
