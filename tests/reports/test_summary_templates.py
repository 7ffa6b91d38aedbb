"""Escaping is the templates' default: a test id and failure text made of markup, table syntax, template
syntax and backticks render inert in summary.html and summary.md, and the checks catch a page that
does not escape."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import jinja2
import pytest

from torchmatrix.reports import summary_templates
from torchmatrix.reports.summary_templates import code

from helpers.report_runs import write_hostile_run

OWN_TAGS = re.compile(r"</?details>|</?summary>")
TEMPLATE_SYNTAX = "id<script>alert(1)</script></td></tr>{{ 7*7 }}{% raw %}{# x #}``tick`` | end"


class PageText(HTMLParser):
    """The tags a page opens and the text a reader sees."""

    def __init__(self):
        super().__init__()
        self.tags, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def html_problems(page: str, text: str) -> list[str]:
    """What makes `text` active in `page`: a tag of its own, or the text not shown to the reader whole."""
    parser = PageText()
    parser.feed(page)
    problems = [f"{parser.tags.count('script')} script tags"] if parser.tags.count("script") != 1 else []
    if text not in "".join(parser.text):
        problems.append("the text is not shown whole: part of it became markup")
    return problems


def markdown_problems(page: str, text: str) -> list[str]:
    """What of `text` reaches markdown outside a code span or fenced block, where it would be markup."""
    problems, fence = [], None
    for line in page.splitlines():
        if fence is None and line.startswith("```"):
            fence = re.match("`+", line).group()
            continue
        if fence is not None:
            fence = None if line == fence else fence
            continue
        outside = re.sub(r"(`+) ?(.+?) ?\1(?!`)", "", OWN_TAGS.sub("", line))
        problems += [f"{token!r} outside a code span: {line}" for token in ("<", "{{", "{%", "{#") if token in outside]
    if code(text, table=False) not in page:
        problems.append("the text is not one code span")
    return problems


@pytest.fixture
def escaping_off(monkeypatch):
    """The known-bad pages: both environments with autoescape off and a finalize hook that passes values through."""
    summary_templates._environment.cache_clear()
    monkeypatch.setattr(summary_templates, "select_autoescape", lambda **_: False)
    monkeypatch.setattr(summary_templates, "html_value", lambda value: value)
    monkeypatch.setattr(summary_templates, "markdown_value", lambda value: value)
    yield
    summary_templates._environment.cache_clear()


def test_markup_table_and_template_syntax_render_inert_in_both_pages(tmp_path):
    run_dir = write_hostile_run(tmp_path, TEMPLATE_SYNTAX)
    assert html_problems((run_dir / "summary.html").read_text(), TEMPLATE_SYNTAX) == []
    assert markdown_problems((run_dir / "summary.md").read_text(), f"test_{TEMPLATE_SYNTAX}") == []


def test_the_checks_catch_pages_rendered_without_escaping(tmp_path, escaping_off):
    run_dir = write_hostile_run(tmp_path, TEMPLATE_SYNTAX)
    assert html_problems((run_dir / "summary.html").read_text(), TEMPLATE_SYNTAX)
    assert markdown_problems((run_dir / "summary.md").read_text(), f"test_{TEMPLATE_SYNTAX}")


def test_values_are_escaped_unless_marked_safe():
    html = jinja2.Template("{{ value }}|{{ value|safe }}", autoescape=True, finalize=summary_templates.html_value)
    assert html.render(value="<b>\u202e") == "&lt;b&gt;\\u202e|<b>\\u202e"
    markdown = summary_templates.markdown_value
    assert (markdown("a|`b`"), markdown(3), markdown(jinja2.filters.Markup("**x**"))) == ("`` a\\|`b` ``", "3", "**x**")
