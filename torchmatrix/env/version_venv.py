"""A torch version's venv outside a nox session, where `nox -s gpu_matrix` keeps it.

`torchmatrix bisect` installs versions that matrix.toml does not list, one step at a time. Each
goes to `<envdir>/gpu_matrix-torch-<V>` (nox's own name for gpu_matrix's venv of that version,
made by nox's own virtualenv class), so a version the matrix installed is reused and one bisect
installs is reused by the matrix, and both share the wheelhouse of torch_install. Both write the
same reuse stamp (install_record) once a venv is installed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.env.component_requirements import RECORD_VARIABLE, install_requirements
from torchmatrix.env.self_install import install_arguments
from torchmatrix.env.torch_install import InstallResult, install_torch
from torchmatrix.matrix.channels import channel_of
from torchmatrix.matrix.config import Matrix
from torchmatrix.user_error import UserError

STAMP_NAME = "torchmatrix-installed.json"


class SelfInstallError(UserError):
    """This torchmatrix did not install into a version's venv: no torch version is to blame, so the
    command stops instead of judging the version."""


def gpu_matrix_python(envdir: Path, version: str) -> Path | None:
    """Where nox puts the python of gpu_matrix's venv of torch `version` under `envdir` (whether
    or not it exists); None without nox, which names it."""
    try:
        from nox.sessions import _normalize_path
    except ImportError:
        return None
    return Path(_normalize_path(str(envdir), f"gpu_matrix(torch={version!r})")) / "bin" / "python"


class VersionVenv:
    """The few nox Session methods torch_install and component_requirements call, over one venv."""

    venv_backend = "virtualenv"

    def __init__(self, envdir: Path, version: str, env: dict[str, str]):
        from nox.sessions import _normalize_path
        from nox.virtualenv import VirtualEnv

        self.virtualenv = VirtualEnv(
            _normalize_path(str(envdir), f"gpu_matrix(torch={version!r})"), reuse_existing=True
        )
        self.env = dict(env)

    @property
    def location(self) -> Path:
        return Path(self.virtualenv.location)

    @property
    def python(self) -> Path:
        return Path(self.virtualenv.bin) / "python"

    def environment(self) -> dict[str, str]:
        """This process's environment as nox gives it to a session of this venv: VIRTUAL_ENV set,
        CONDA_PREFIX dropped, the bin directory first on PATH, the version's own variables."""
        merged = {**os.environ, **self.virtualenv.env, **self.env}
        merged["PATH"] = os.pathsep.join([self.virtualenv.bin, merged.get("PATH", "")])
        return {key: value for key, value in merged.items() if value is not None}

    def run_install(self, *args: str, **options):
        """Run a command with the venv's bin first on PATH (as nox's session.run_install does)."""
        import nox.command

        options.setdefault("log", False)
        return nox.command.run(
            list(args), env=self.environment(), paths=self.virtualenv.bin_paths, external=True, **options
        )

    def install(self, *args: str, **options):
        return self.run_install("python", "-m", "pip", "install", *args, **options)


def install_record(matrix: Matrix, version: str) -> dict:
    """What gpu_matrix installs into torch `version`'s venv, as its reuse stamp records it: the same
    record means nothing needs installing again."""
    install = matrix.install(version)
    return {
        "torch": version,
        "install": [install.index_url, list(install.requirements), list(install.constraints)],
        "torchmatrix": install_arguments(),
        "requires": {key: list(value) for key, value in sorted(matrix.requires.items())},
    }


def clear_stamp(location: Path) -> None:
    """Before installing: a venv whose install is under way or failed is never reused."""
    (Path(location) / STAMP_NAME).unlink(missing_ok=True)


def write_stamp(location: Path, record: dict) -> None:
    """After installing: the venv holds `record`, for the next session or bisect step to reuse."""
    file_writes.write_text(Path(location) / STAMP_NAME, json.dumps(record))


def stamp_matches(location: Path, record: dict) -> bool:
    return _read_stamp(Path(location) / STAMP_NAME) == record


def stamped_as(location: Path, version: str, record: dict) -> bool:
    """Whether the venv at `location` holds `record`, as its stamp says: a pinned release's only,
    never a channel's ("nightly", "rc"), whose build changes by the day."""
    return channel_of(version) is None and stamp_matches(location, record)


def kept_as_installed(virtualenv, version: str, record: dict) -> bool:
    """Whether nox kept this venv of torch `version` from an earlier session and it holds `record`."""
    return channel_of(version) is None and kept_holding(virtualenv, record)


def kept_holding(virtualenv, record: dict) -> bool:
    """Whether nox kept this venv from an earlier session and its stamp says it holds `record`."""
    return getattr(virtualenv, "_reused", False) and stamp_matches(Path(virtualenv.location), record)


def renew(virtualenv) -> None:
    """Make a venv nox kept anew, so that nothing an earlier install left (a component's package the
    matrix no longer requires, another torch) stays beside what is installed next."""
    if getattr(virtualenv, "_reused", False):
        virtualenv.reuse_existing = False
        virtualenv.create()
        virtualenv._reused = False


def prepare_venv(matrix: Matrix, envdir: Path, version: str, logs: Path) -> tuple[VersionVenv, InstallResult, bool]:
    """Create or reuse torch `version`'s venv and install into it what gpu_matrix installs: torch as
    `[torch.install."V"]` says, this torchmatrix, `[requires]`. A venv whose stamp (written by the
    gpu_matrix session or an earlier bisect) says the same was installed before is reused as it is
    (nothing is downloaded or installed twice); the last value says whether it was."""
    install = matrix.install(version)
    venv = VersionVenv(envdir, version, install.env)
    venv.env[RECORD_VARIABLE] = str(venv.location / "torchmatrix-requires.json")
    wanted = install_record(matrix, version)
    created = venv.virtualenv.create()
    if not created and stamp_matches(venv.location, wanted):
        return venv, InstallResult(True), True
    clear_stamp(venv.location)
    logs.mkdir(parents=True, exist_ok=True)
    installed = install_torch(venv, version, install, logs / "install.log")
    if not installed.ok:
        return venv, installed, False
    _install_this_torchmatrix(venv, version)
    if matrix.requires:
        install_requirements(venv, matrix.requires, install.constraints, logs / "requires.log")
    write_stamp(venv.location, wanted)
    return venv, installed, False


def _install_this_torchmatrix(venv: VersionVenv, version: str) -> None:
    from nox.command import CommandFailed

    arguments = install_arguments()
    try:
        venv.install(*arguments, silent=True, stderr=subprocess.STDOUT)
    except CommandFailed as failure:
        raise SelfInstallError(
            f"torch {version}'s venv {venv.location}: `pip install {' '.join(arguments)}` failed ({failure.reason}; "
            "pip's output is above): install torchmatrix so that pip can install it again (a checkout, a path or a release), then rerun"
        ) from None


def _read_stamp(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
