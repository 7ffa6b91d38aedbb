"""The jinja2 environments that render the summary pages from templates/, each escaping every value by default.

- HTML: autoescape on; the finalize hook first makes every value visible (untrusted_text).
- Markdown: the finalize hook makes every value that is not already markdown (`Markup`, a number,
  a status) a code span with its pipes escaped for tables (`|inline`: the same span outside a
  table). Autoescape is on here too, only so that macro output, already markdown, passes as it is.
- Trusted words (counts, formatted numbers, notes the runner wrote) are marked with `count`, `|fmt`
  or `|safe`; nothing else reaches either page unescaped.
"""

from __future__ import annotations

import re
from enum import Enum
from functools import cache

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from torchmatrix.reports.bump_verdict import bump_verdict
from torchmatrix.reports.checkpoint_directions import relative_to_run
from torchmatrix.reports.memory_growth import MEMORY_RULE
from torchmatrix.reports.reproducible import is_reproducible, repro_command
from torchmatrix.reports.summary_data import (
    DIRECTIONS_NOTE,
    LIMITS_NOTE,
    direction_rows,
    distinct_texts,
    other_cells,
    reached_by,
    read_label,
)
from torchmatrix.reports.untrusted_text import one_line, visible
from torchmatrix.reports.upgrade_diff import SLOWDOWN_RULE
from torchmatrix.reports.warning_changes import COUNT_FACTOR
from torchmatrix.status import ORDER_DEPENDENT, PARTLY_SKIPPED, Confirmation, Status, count


def code(text: object, table: bool = True) -> str:
    """`text` as one code span: markdown and HTML inside it stay literal; pipes are escaped for tables."""
    line = visible(" ".join(str(text).split())) if str(text).strip() else ""
    if not line:
        return ""
    if table:
        line = line.replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall("`+", line)), default=0) + 1)
    pad = " " if line.startswith("`") or line.endswith("`") else ""
    return f"{fence}{pad}{line}{pad}{fence}"


def fenced(text: str) -> Markup:
    """`text` as a fenced code block whose fence is longer than any backtick run inside it."""
    body = visible(text)
    fence = "`" * max(3, max((len(run) for run in re.findall("`+", body)), default=0) + 1)
    return Markup(f"{fence}text\n{body}\n{fence}")


def markdown_value(value: object) -> Markup:
    """What `{{ value }}` writes into markdown: markup and numbers as they are, any other text as a code span."""
    if isinstance(value, Markup):
        return value
    if isinstance(value, (int, float, Enum)):
        return Markup(str(value))
    return Markup(code(value))


def html_value(value: object) -> object:
    """What `{{ value }}` writes into HTML before autoescape: invisible characters shown as escapes."""
    return Markup(visible(value)) if isinstance(value, Markup) else visible(str(value))


def fmt(value: float, spec: str) -> Markup:
    """A number in a format spec (`.1f`, `,`, `g`): digits, trusted on both pages."""
    return Markup(format(value, spec))


def trusted_count(n: int, singular: str, plural: str | None = None) -> Markup:
    """status.count (`3 cells`), marked as the runner's own words."""
    return Markup(count(n, singular, plural))


def render_html(template: str, **context: object) -> str:
    """summary.html (or another HTML template) rendered with `context`."""
    return _environment("html").get_template(template).render(**context)


def render_markdown(template: str, **context: object) -> str:
    """summary.md (or another markdown template) rendered with `context`."""
    return _environment("md").get_template(template).render(**context)


@cache
def _environment(kind: str) -> Environment:
    environment = Environment(
        loader=PackageLoader("torchmatrix.reports", "templates"),
        autoescape=select_autoescape(enabled_extensions=("html", "md")),
        finalize=html_value if kind == "html" else markdown_value,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    environment.globals.update(count=trusted_count)
    environment.filters.update(fmt=fmt, one_line=one_line, relative=relative_to_run)
    if kind == "md":
        environment.filters.update(inline=lambda text: Markup(code(text, table=False)), fenced=fenced)
    return environment


def page_names() -> dict[str, object]:
    """The words, marks and functions both summary pages' templates use (each page adds its own)."""
    return dict(
        Status=Status,
        ORDER_DEPENDENT=ORDER_DEPENDENT,
        PARTLY_SKIPPED=PARTLY_SKIPPED,
        COUNT_FACTOR=COUNT_FACTOR,
        SLOWDOWN_RULE=SLOWDOWN_RULE,
        MEMORY_RULE=MEMORY_RULE,
        LIMITS_NOTE=LIMITS_NOTE,
        DIRECTIONS_NOTE=DIRECTIONS_NOTE,
        bump_verdict=bump_verdict,
        describe=Confirmation.describe,
        direction_rows=direction_rows,
        distinct_texts=distinct_texts,
        other_cells=other_cells,
        reached_by=reached_by,
        read_label=read_label,
        reproducible=is_reproducible,
        repro_command=repro_command,
    )
