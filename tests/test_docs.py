"""The documentation's examples cannot rot: every fenced `bash`, `toml`, `python` and `yaml` block of
README.md and docs/**/*.md (found by glob, so a new page is covered without a change here) is
parsed by the code that would run it, and every generated table of every page renders.

Commands are parsed, not run (a matrix run takes minutes): `python -m torchmatrix` and `torchmatrix`
by the real argparse parser, `nox` by nox's own option parser with each session looked up in this
checkout's `nox -l`, a repository script by its file and options. NOT_RUN lists, with the reason,
each command a page shows that none of these checks.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import textwrap

import pytest
import yaml

from torchmatrix import status
from torchmatrix.cli import build_parser
from torchmatrix.matrix.config import ConfigError, load_matrix, tomllib
from torchmatrix.matrix.selection import SelectionError
from torchmatrix.matrix.suite_selection import SuiteSelection

from helpers.checkout import REPO, checkout_env

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(?P<lang>[\w-]+)[^\n]*\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)
# Synopsis placeholders that a typed option needs as a value; every other placeholder is a string.
PLACEHOLDERS = {"N": "2", "G": "8", "V": "2.13.0"}
# The CLI command each nox session hands its arguments after `--` to (torchmatrix.sessions).
SESSION_COMMANDS = {
    "gpu_matrix": ["run", "--torch", "system"],
    "list": ["list"],
    "compare": ["compare"],
    "merge": ["merge"],
    "sensitivity": ["sensitivity"],
    "cli": [],
}
NOT_RUN = {
    "pip install nox": "installs nox into the reader's environment; .ci/run does the same",
    "pip install -e .": "installs this checkout; tests/test_cli_install.py does it in a fresh venv",
    "pip install -e '.[test]' torch==2.13.0 numpy": "the development set-up; `nox -s tests` installs the same",
    "pip install /path/to/torchmatrix": "installs from a path; tests/test_outside_checkout.py does it in a fresh venv",
    "pytest -n auto --dist loadscope --no-loadscope-reorder": "the whole test suite (this test is part of it)",
    "pytest -n auto -m 'not slow'": "the fast lane of the test suite (this test is part of it)",
    "pip download torch==2.13.0 --no-deps -d /work/local-channels/src": "fetches the wheel the local channels repack; test-nightly-and-rc.md shows the run",
    "bash reports/slurm/submit.sh": "submits to a Slurm cluster; tests/scale/test_slurm_cluster.py runs the scripts",
}


def fenced_blocks(*languages: str) -> list:
    """A pytest param (page:line, body), with page:line as its id, per fenced block in one of these languages."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in FENCE.finditer(text):
            if block["lang"] in languages:
                line = text.count("\n", 0, block.start()) + 1
                where = f"{page.relative_to(REPO)}:{line}"
                found.append(pytest.param(where, block["body"], id=where))
    return found


def unmarked_fences(text: str) -> list[int]:
    """Lines of fenced blocks that open without a language: the language is the marker this test
    selects examples by (`text` for output and diagrams), so an unmarked block would escape it."""
    unmarked, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if not inside and line.strip() == "```":
                unmarked.append(number)
            inside = not inside
    return unmarked


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_fenced_block_says_what_it_is(page):
    assert unmarked_fences(page.read_text()) == [], f"{page.relative_to(REPO)}: mark these blocks bash, toml, text, ..."


def test_an_unmarked_block_is_caught():
    assert unmarked_fences("```bash\nnox -s tests\n```\n\n```\nnox -s testz\n```\n") == [5]


def shell_commands(body: str) -> list[list[str]]:
    """Each command of a shell block as its words: continuation lines joined, comments dropped, `&&` split."""
    commands = []
    for line in body.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            end = words.index("&&") if "&&" in words else len(words)
            commands.append(words[:end])
            words = words[end + 1 :]
    return commands


def concrete(words: list[str]) -> list[str]:
    """A synopsis as arguments: optional brackets dropped (the options kept), `DIR...` as one DIR, placeholders valued."""
    arguments = []
    for word in words:
        word = word.removeprefix("[").removesuffix("]").removesuffix("...")
        if word:
            arguments.append(PLACEHOLDERS.get(word, word.replace("torch='V'", f"torch='{PLACEHOLDERS['V']}'")))
    return arguments


def parse_torchmatrix(arguments: list[str]) -> None:
    """What `python -m torchmatrix` would do with these arguments up to running: argparse's verdict,
    then, for `run`, the suites and tests `--suite` and `--test` name, looked up in this checkout's
    matrix.toml and suite files."""
    try:
        parsed = build_parser().parse_args(arguments)
    except SystemExit as stop:
        if stop.code != 0:  # --help exits 0
            raise AssertionError(f"torchmatrix {shlex.join(arguments)}: the parser refuses it") from None
        return
    if parsed.command == "run" and (parsed.suites or parsed.tests):
        matrix = load_matrix(str(REPO / "matrix.toml"))
        try:
            SuiteSelection(tuple(parsed.suites), tuple(parsed.tests)).choose(matrix.suites, matrix.root)
        except SelectionError as error:
            raise AssertionError(f"torchmatrix {shlex.join(arguments)}: {error}") from None


@pytest.fixture(scope="module")
def nox_sessions() -> set[str]:
    """The sessions this checkout's noxfile declares, as `nox -l --json` lists them."""
    listed = subprocess.run(
        [sys.executable, "-m", "nox", "-l", "--json"],
        cwd=REPO,
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return {entry["session"] for entry in json.loads(listed.stdout)} | {
        entry["name"] for entry in json.loads(listed.stdout)
    }


def check_nox(arguments: list[str], sessions: set[str]) -> None:
    """nox's own parser takes the options; each named session exists; the arguments after `--` parse
    as the torchmatrix command the session passes them to."""
    from nox._options import options

    try:
        parsed = options.parser().parse_args(arguments)
    except SystemExit:
        raise AssertionError(f"nox {shlex.join(arguments)}: nox's parser refuses it") from None
    for name in getattr(parsed, "sessions", None) or []:
        assert name in sessions, f"nox -s {name}: no such session (nox -l lists {sorted(sessions)})"
        base = name.split("(")[0]
        posargs = parsed.posargs[1:] if parsed.posargs[:1] == ["--"] else parsed.posargs
        if base == "report":
            compare = posargs.index("--compare") if "--compare" in posargs else len(posargs)
            parse_torchmatrix(["report", *posargs[:compare]])
            if posargs[compare:]:
                parse_torchmatrix(["compare", posargs[compare + 1], "RUN"])
        elif base in SESSION_COMMANDS and posargs:
            parse_torchmatrix([*SESSION_COMMANDS[base], *posargs])


def check_script(path: str, options: list[str]) -> None:
    """A repository script: the file exists and declares every option the page passes it."""
    source = REPO / path
    assert source.is_file(), f"{path}: no such file in the repository"
    for option in options:
        if option.startswith("--"):
            assert f'"{option}"' in source.read_text(), f"{path} takes no {option}"


def check_command(words: list[str], sessions: set[str]) -> None:
    arguments = concrete(words)
    if arguments[:3] == ["python", "-m", "torchmatrix"]:
        parse_torchmatrix(arguments[3:])
    elif arguments[:1] == ["torchmatrix"]:
        parse_torchmatrix(arguments[1:])
    elif arguments[:1] == ["nox"]:
        check_nox(arguments[1:], sessions)
    elif arguments[:1] == ["python"] and arguments[1].endswith(".py"):
        check_script(arguments[1], arguments[2:])
    else:
        assert shlex.join(words) in NOT_RUN, (
            f"{shlex.join(words)!r}: no test checks it; check it, or list it in NOT_RUN"
        )


@pytest.mark.parametrize(("where", "body"), fenced_blocks("bash", "sh", "shell", "console"))
def test_every_shell_command_parses(where, body, nox_sessions):
    for words in shell_commands(body):
        try:
            check_command(words, nox_sessions)
        except AssertionError as error:
            raise AssertionError(f"{where}: {error}") from None


def test_every_exception_is_still_shown_somewhere():
    blocks = fenced_blocks("bash", "sh", "shell", "console")
    shown = {shlex.join(words) for block in blocks for words in shell_commands(block.values[1])}
    assert set(NOT_RUN) <= shown, f"NOT_RUN lists commands no page shows: {sorted(set(NOT_RUN) - shown)}"


MINIMAL_MATRIX = {
    "torch": '[torch]\nversions = ["2.13.0"]\n',
    "axes": "[axes]\nworld_size = [1]\n",
    "suites": "[suites.collectives]\n",
}


@pytest.mark.parametrize(("where", "body"), fenced_blocks("toml"))
def test_every_matrix_toml_snippet_loads(where, body, tmp_path):
    """A snippet loads as matrix.toml; one without [torch] or [axes] gets the smallest ones, and the
    suite files it names exist, as they would in the reader's project."""
    tables = tomllib.loads(body)
    text = "".join(table for key, table in MINIMAL_MATRIX.items() if key not in tables) + body
    project = tmp_path / "a" / "b"  # room for a `[project] root` that leads up
    project.mkdir(parents=True)
    for suite in tables.get("suites", {}).values():
        if "path" in suite:
            (project / suite["path"]).parent.mkdir(parents=True, exist_ok=True)
            (project / suite["path"]).touch()
    (project / "matrix.toml").write_text(text)
    try:
        load_matrix(project / "matrix.toml")
    except ConfigError as error:
        raise AssertionError(f"{where}: {error}") from None


@pytest.mark.parametrize(("where", "body"), fenced_blocks("python"))
def test_every_python_block_compiles(where, body):
    ast.parse(textwrap.dedent(body), filename=where)


@pytest.mark.parametrize(("where", "body"), fenced_blocks("yaml", "yml"))
def test_every_yaml_block_parses(where, body):
    assert yaml.safe_load(body) is not None, where


def load_hook():
    spec = importlib.util.spec_from_file_location("docs_generated_hook", REPO / "docs" / "hooks" / "generated.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return hook


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_generated_table_renders(page):
    hook = load_hook()
    rendered = hook.expand(page.read_text())
    assert not hook.MARKER.search(rendered)


def rendered(relative: str) -> str:
    return load_hook().expand((REPO / "docs" / relative).read_text())


@pytest.mark.parametrize(
    ("page", "table"),
    [
        ("reference/components.md", "torchmatrix.components.protocol:markdown_table"),
        ("explanation/cpu-simulation.md", "torchmatrix.ranks.simulation_limits:markdown_table"),
        ("reference/matrix-toml.md", "torchmatrix.matrix.config:markdown_keys"),
        ("reference/matrix-toml.md", "torchmatrix.matrix.builtin_suites:markdown_table"),
        ("reference/command-line.md", "torchmatrix.cli_reference:markdown_reference"),
        ("reference/results-json.md", "torchmatrix.reports.format_reference:results_json_keys"),
        ("reference/junit.md", "torchmatrix.reports.format_reference:junit_properties"),
        ("getting-started/reading-the-report.md", "torchmatrix.status:legend_markdown"),
        ("reference/junit.md", "torchmatrix.reports.format_reference:junit_direction_properties"),
    ],
)
def test_each_reference_table_is_on_its_page_as_the_code_renders_it(page, table):
    module, function = table.split(":")
    assert getattr(importlib.import_module(module), function)() in rendered(page)


def undescribed_keys(page_source: str) -> list[str]:
    """results.json keys the writer produces that the page's own prose never names in backticks."""
    from torchmatrix.reports.format_reference import results_json_keys

    paths = re.findall(r"^\| `([^`]+)` \|", results_json_keys(), re.MULTILINE)
    names = {re.split(r"[.\[\]]+", path.rstrip("[]"))[-1] for path in paths}
    return sorted(name for name in names if not re.search(f'[`"]{re.escape(name)}[`"]', page_source))


def test_every_results_json_key_is_described_on_its_page():
    assert undescribed_keys((REPO / "docs" / "reference" / "results-json.md").read_text()) == []


def test_a_key_left_undescribed_is_caught():
    page = (REPO / "docs" / "reference" / "results-json.md").read_text()
    assert undescribed_keys(page.replace("`pool_starts`", "pool starts")) == ["pool_starts"]


def test_a_marker_naming_no_function_fails_the_build():
    with pytest.raises(AttributeError):
        load_hook().expand("<!-- generated: torchmatrix.cli_reference:no_such_table -->")


def test_the_command_line_page_lists_every_command_and_option_the_parser_has():
    page = rendered("reference/command-line.md")
    parser = build_parser()
    commands = next(action for action in parser._actions if action.dest == "command").choices
    for name, command in commands.items():
        assert f"### {name}\n" in page
        for action in command._actions:
            if action.help != "==SUPPRESS==" and action.option_strings and action.dest != "help":
                assert f"`{action.option_strings[0]}" in page, (name, action.option_strings)


@pytest.mark.parametrize(
    ("command", "refusal"),
    [
        ("python -m torchmatrix run --torch 2.13.0 --only-cells ws1", "the parser refuses it"),
        ("torchmatrix slurm --shards 4", "the parser refuses it"),  # --gpus-per-node is required
        ("nox -s \"gpu_matrix(torch='9.9.9')\"", "no such session"),
        ("nox -s gpu_matrix -- --shard", "the parser refuses it"),
        ("nox --no-such-option -s tests", "nox's parser refuses it"),
        ("python bench/matrix_walltime.py --no-such-option", "takes no --no-such-option"),
        ("python bench/no_such_bench.py", "no such file"),
        ("pip install torchmatrix-nightly", "no test checks it"),
        (
            "python -m torchmatrix run --torch system --test grad_ckpt::test_grads_match",
            "matches no test of suite grad_ckpt",
        ),
        ("nox -s gpu_matrix -- --suite grad_checkpointing", "no suite 'grad_checkpointing'"),
    ],
)
def test_a_rotten_command_is_caught(command, refusal, nox_sessions):
    """Known-bad commands, as a page might show them after the code moved on."""
    with pytest.raises(AssertionError, match=re.escape(refusal)):
        for words in shell_commands(command):
            check_command(words, nox_sessions)


def test_a_rotten_matrix_toml_snippet_is_caught(tmp_path):
    with pytest.raises(AssertionError, match="no_such_key"):
        test_every_matrix_toml_snippet_loads("page.md:1", "[report]\nno_such_key = 1\n", tmp_path)


def test_the_site_opens_from_disk_with_code_that_wraps():
    """Pages are files (a page opened from disk links to page.html, not to a directory listing), and
    code blocks wrap their long lines."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config["use_directory_urls"] is False
    css = [REPO / "docs" / sheet for sheet in config["extra_css"]]
    assert any("white-space: pre-wrap" in sheet.read_text() for sheet in css)


def test_the_marks_legend_reads_without_an_emoji_font():
    """Every mark a grid shows is in the legend the docs render (reading-the-report.md, checked
    above to be the generated table) with its meaning in words and summary.html's symbol, a plain
    text character: no emoji code point and no emoji variation selector."""
    shown = [mark for mark, _ in status.grid_legend()]
    special = {status.PARTLY_SKIPPED, status.ORDER_DEPENDENT, status.NOT_RUN}
    assert {outcome.mark for outcome in status.Status} | special == set(shown)
    for mark, meaning in status.grid_legend():
        assert meaning and mark.symbol, mark
        assert all(ord(char) < 0x1F000 and char != "\ufe0f" for char in mark.symbol), mark


PROGRESS_LINE = re.compile(r"^\[\s*(\d+)/(\d+)\] torch (\S+) (\S+): (\w+) \((\d+) tests")


def test_the_first_runs_progress_lines_name_cells_and_counts_of_the_default_matrix():
    """The progress lines the first-run page shows name cells of this checkout's matrix.toml, with
    an N of its cells (one version or all, every world size or the one-rank path) and k within it.
    (Transcripts of other matrices, as the bisect page's, say which run they come from.)"""
    matrix = load_matrix(str(REPO / "matrix.toml"))
    cells = matrix.cells()
    one_rank = [cell for cell in cells if cell.world_size == 1]
    totals = {len(cells), len(cells) * len(matrix.versions), len(one_rank), len(one_rank) * len(matrix.versions)}
    page = REPO / "docs" / "getting-started" / "first-run.md"
    found = [match for line in page.read_text().splitlines() if (match := PROGRESS_LINE.match(line))]
    assert found, "the first-run page shows the progress lines"
    for match in found:
        done, total, _, cell, _, _ = match.groups()
        assert cell in {c.id for c in cells}, f"{cell} is not a cell of matrix.toml"
        assert int(total) in totals and 1 <= int(done) <= int(total), f"[{done}/{total}]"


SUITE_COUNTS = {"four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


def test_the_screenshot_caption_counts_what_the_one_rank_path_runs():
    """README's caption of docs/images/summary.png (docs/screenshot.py: the world_size=1 cells of this
    checkout's matrix.toml) names as many cells and suites as that selection has."""
    caption = re.search(r"--only world_size=1` on a CPU-only machine: (\d+) cells, (\w+) suites each", readme_text())
    assert caption, "README's screenshot caption says what the page shows"
    matrix = load_matrix(str(REPO / "matrix.toml"))
    one_rank = [cell for cell in matrix.cells() if cell.world_size == 1]
    assert (int(caption[1]), SUITE_COUNTS.get(caption[2])) == (len(one_rank), len(matrix.suites))


def readme_text() -> str:
    """README.md with its line breaks as spaces, so a phrase reads whole wherever it wraps."""
    return " ".join((REPO / "README.md").read_text().split())


@pytest.mark.slow
def test_the_readme_matrix_runs_green(project):
    """The README's minimal matrix.toml is one a reader can run: its one-rank cell without FSDP
    passes every suite on the torch here (the pre-run component check alone missed a missing axis)."""
    (readme_matrix,) = [block.values[1] for block in fenced_blocks("toml") if block.values[0].startswith("README")]
    project.write("matrix.toml", readme_matrix)
    run = project.torchmatrix("run", "--torch", "system", "--only", "world_size=1", "--only", "fsdp=none")
    assert run.returncode == 0, run.stdout + run.stderr
    assert ", 0 failed, 0 errors," in run.stdout
