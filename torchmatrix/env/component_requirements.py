"""`[requires]`: the pip packages a component needs, installed into each torch venv after torch.

Each component's requirements install on their own, so a package that cannot be installed for
one torch version (no wheel for it, a conflicting pin) costs only the cells that use it: the
session records pip's one-line reason per component in the venv, and the suite process errors
those cells with it, or skips them where `[optional]` allows (torchmatrix.ranks.plugin). The
record lives in the venv, so `nox -R`, which installs nothing, still finds what the venv lacks
and why.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from torchmatrix import file_writes

RECORD_VARIABLE = "TORCHMATRIX_REQUIRES_RECORD"
RECORD_NAME = "torchmatrix-requires.json"


def install_requirements(
    session, requires: dict[str, tuple[str, ...]], constraints: tuple[str, ...], log_path: Path
) -> dict[str, str]:
    """Install each component's requirements into the session's venv (one installer call per
    distinct list), return component key -> pip's reason for those that failed, and record them
    in the venv for the suites; with `nox -R` install nothing and return the venv's record."""
    import nox

    from torchmatrix.env.install_progress import InstallProgress, ProgressLine
    from torchmatrix.env.torch_install import StreamedCommand

    record = use_record(session)
    if session.run_install("python", "--version", silent=True, log=False) is None:
        return read_record(record)  # nox -R: the venv is reused and installs are skipped
    constraint_options = []
    if constraints:
        constraints_file = log_path.parent / "requires-constraints.txt"
        file_writes.write_text(constraints_file, "\n".join(constraints) + "\n")
        constraint_options = ["--constraint", str(constraints_file)]
    failed: dict[str, str] = {}
    with file_writes.open_stream(log_path) as log:
        for requirements in dict.fromkeys(requires.values()):
            users = [key for key, wanted in requires.items() if wanted == requirements]
            progress = InstallProgress(" ".join(requirements))
            line = ProgressLine(progress)
            log.write(f"# {', '.join(users)}: {' '.join(requirements)}\n")
            log.flush()
            stream = StreamedCommand(log, progress, line)
            try:
                session.install(
                    *requirements, *constraint_options, silent=False, stdout=stream.writer, stderr=subprocess.STDOUT
                )
                stream.close()
                line.close("done")
            except nox.command.CommandFailed:
                stream.close()
                reason = progress.reason or f"the installer failed (see {log_path})"
                line.close(f"failed: {reason}")
                failed.update(dict.fromkeys(users, reason))
    file_writes.write_text(
        record, json.dumps({key: {"requires": list(requires[key]), "reason": failed[key]} for key in failed})
    )
    return failed


def use_record(session) -> Path:
    """Point the session's runs at its venv's record of requirements that did not install, and return it."""
    record = Path(session.virtualenv.location) / RECORD_NAME
    session.env[RECORD_VARIABLE] = str(record)
    return record


def read_record(path: Path | str) -> dict[str, str]:
    """Component key -> why its requirements are not installed, from a record the session wrote."""
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return {key: f"{' '.join(entry['requires'])}: {entry['reason']}" for key, entry in entries.items()}


def uninstalled_here(environ=os.environ) -> dict[str, str]:
    """The record of the venv this process runs in (empty outside a matrix session)."""
    path = environ.get(RECORD_VARIABLE)
    return read_record(path) if path else {}
