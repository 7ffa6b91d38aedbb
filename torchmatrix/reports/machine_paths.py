"""Text that goes upstream (a failure's message and traceback, a report's header, a reproducer)
without this machine's paths: a path into the run directory is written relative to it, one into
the user's project relative to the project, and the home directory as `~`."""

from __future__ import annotations

import os
import re
from pathlib import Path

SEPARATOR = r"[/\\]"
PATH_CHARACTER = r"[\w.+-]"


def without_machine_paths(text: str, run_dir: Path | None, project: Path | None = None) -> str:
    """`text` with every absolute path under `run_dir`, `project` or the home directory made
    relative (the longest, most specific prefix first; the directory itself becomes `.` or `~`)."""
    for prefix, alone in _prefixes(run_dir, project):
        pattern = re.compile(re.escape(prefix) + f"({SEPARATOR}|(?!{PATH_CHARACTER}))")
        text = pattern.sub(lambda match, alone=alone: _replacement(alone, match.group(1)), text)
    return text


def _replacement(alone: str, separator: str) -> str:
    """A prefix under the run or project goes (`torch-2.15.0/x`), home becomes `~/`; the directory itself `.` or `~`."""
    if alone == "~":
        return "~" + separator
    return "" if separator else "."


def _prefixes(run_dir: Path | None, project: Path | None) -> list[tuple[str, str]]:
    """(absolute prefix, what the directory alone becomes), longest first; each as given and resolved."""
    found: dict[str, str] = {}
    for directory, alone in ((run_dir, "."), (project, "."), (_home(), "~")):
        if directory is None:
            continue
        for form in (str(directory), os.path.realpath(directory)):
            form = form.rstrip("/\\")
            if os.path.isabs(form) and form not in found and len(Path(form).parts) > 1:
                found[form] = alone
    return sorted(found.items(), key=lambda item: -len(item[0]))


def _home() -> Path | None:
    try:
        return Path.home()
    except (KeyError, RuntimeError):  # no HOME and no passwd entry
        return None


def relative_path(path: str, run_dir: Path) -> str:
    """`path` as seen from `run_dir` (`../../matrix.toml`), or its name alone when the two share
    nothing but the file system's root."""
    if not path or not os.path.isabs(path):
        return path
    common = os.path.commonpath([os.path.realpath(path), os.path.realpath(run_dir)])
    if len(Path(common).parts) <= 1:
        return Path(path).name
    return os.path.relpath(os.path.realpath(path), os.path.realpath(run_dir))
