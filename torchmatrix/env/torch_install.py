"""Install one torch version into a nox session's venv, as matrix.toml's `[torch.install."V"]` says.

First the index is asked whether it has `torch==V` (`pip index versions torch`, which reads the
user's pip configuration; uv resolves torch alone from metadata), so a version it does not have
fails in seconds with the installer's one-line reason. Then torch, numpy and the
version's extra requirements install with their progress on the terminal and the installer's
full output in install.log.

Downloads are reused across venvs and re-runs. uv's cache keeps every wheel. pip's HTTP cache
keeps one only when the index allows it (a proxy that strips Cache-Control defeats it), so with
pip the files go to a wheelhouse first (`pip download -d`, which skips files already there) and
install from it with `--no-index`: a version seen before costs no download, whatever the network.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from torchmatrix import file_writes
from torchmatrix.env.channel_install import AVAILABLE_VERSIONS, ChannelBuild, channel_build
from torchmatrix.env.install_estimate import InstallEstimate, estimate_install, wheelhouse_files
from torchmatrix.env.install_progress import InstallProgress, ProgressLine
from torchmatrix.env.pip_constraints import blocking_constraint
from torchmatrix.matrix.channels import ChannelError, channel_of
from torchmatrix.matrix.config import TorchInstall

WHEELHOUSE_VARIABLE = "TORCHMATRIX_WHEELHOUSE"
PIP_CONFIG_LINE = re.compile(r"^(?:global|install|:env:)\.([a-z-]+)='(.*)'$")
PIP_RAW_PROGRESS_SINCE = (24, 1)


@dataclass(frozen=True)
class InstallResult:
    """Whether the version installed, and the installer's one-line reason when it did not."""

    ok: bool
    reason: str = ""


def pip_index_options(pip_config_list: str) -> list[str]:
    """uv options equal to pip's index settings (`pip config list` output: files, then PIP_* vars).

    uv reads neither pip.conf nor PIP_* variables; with these and `--index-strategy
    unsafe-best-match` it looks where pip looks and picks the best version across indexes as pip does.
    """
    settings: dict[str, str] = {}
    for line in pip_config_list.splitlines():
        if match := PIP_CONFIG_LINE.match(line.strip()):
            settings[match[1]] = match[2]
    options = ["--index-strategy", "unsafe-best-match"]
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        options.append("--no-index")
    if "index-url" in settings:
        options += ["--index-url", settings["index-url"]]
    for url in settings.get("extra-index-url", "").split():
        options += ["--extra-index-url", url]
    for location in settings.get("find-links", "").split():
        options += ["--find-links", location]
    return options


def index_options(install: TorchInstall, *, uv: bool, pip_config_list: str) -> list[str]:
    """Where the installer looks: for uv, pip's settings made explicit; then the version's index_url."""
    options = pip_index_options(pip_config_list) if uv else []
    if install.index_url:
        if "--index-url" in options:
            at = options.index("--index-url")
            del options[at : at + 2]
        options += ["--index-url", install.index_url]
    return options


def index_has(version: str, index_versions_output: str) -> bool:
    """Whether `pip index versions torch` listed a release that `torch==version` accepts (local labels such as +cpu included)."""
    listed = AVAILABLE_VERSIONS.search(index_versions_output)
    wanted = SpecifierSet(f"=={version}")
    for text in listed[1].split(", ") if listed else []:
        try:
            if wanted.contains(Version(text), prereleases=True):
                return True
        except InvalidVersion:
            continue
    return False


def wheelhouse(version: str, install: TorchInstall, environ=os.environ) -> Path | None:
    """Where pip's downloads for this version are kept: `$TORCHMATRIX_WHEELHOUSE` (default
    `~/.cache/torchmatrix/wheels`, `off` for none), one folder per version and index."""
    root = environ.get(WHEELHOUSE_VARIABLE)
    if root == "off":
        return None
    if not root:
        cache = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(cache) / "torchmatrix" / "wheels")
    index = hashlib.sha256((install.index_url or "").encode()).hexdigest()[:8] if install.index_url else "default"
    return Path(root) / f"torch-{version}-{index}"


class StreamedCommand:
    """A pipe a nox command writes into; a thread copies it to the log and feeds the progress."""

    def __init__(self, log, progress: InstallProgress, line: ProgressLine):
        read_fd, write_fd = os.pipe()
        self.writer = os.fdopen(write_fd, "w")
        self.reader = os.fdopen(read_fd, "r", errors="replace")
        self.log, self.progress, self.line = log, progress, line
        self.thread = threading.Thread(target=self._copy, daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        for text in self.reader:
            self.log.write(text)
            self.progress.feed(text)
            self.line.update()
        self.log.flush()

    def close(self) -> None:
        self.writer.close()
        self.thread.join()
        self.reader.close()


def install_torch(session, version: str, install: TorchInstall, log_path: Path) -> InstallResult:
    """Check that torch==V resolves, then install it with numpy and the version's requirements."""
    import nox

    uv = getattr(session, "venv_backend", "virtualenv") == "uv"
    probe = ["python", "--version"] if uv else ["python", "-m", "pip", "--version"]
    installer_version = session.run_install(*probe, silent=True, log=False)
    if installer_version is None:
        return InstallResult(True)  # nox -R: the venv is reused and installs are skipped
    pip_config = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        env={**os.environ, **install.env},  # a version's env may set PIP_INDEX_URL and friends
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    options = index_options(install, uv=uv, pip_config_list=pip_config)
    constraints = []
    if install.constraints:
        constraints_file = log_path.parent / "constraints.txt"
        file_writes.write_text(constraints_file, "\n".join(install.constraints) + "\n")
        constraints = ["--constraint", str(constraints_file)]
    installer = ["uv", "pip", "install"] if uv else ["python", "-m", "pip", "install"]
    channel, build = version, _channel_build(version, install, uv)
    if isinstance(build, InstallResult):
        print(f"torchmatrix: {build.reason}", flush=True)
        return build
    if build is not None:
        said = f"torch {build.version}, from {'the wheelhouse ' + str(build.wheels) if build.cached else install.index_url}"
        print(f"torchmatrix: torch {channel} is {said}", flush=True)
        version, install = build.version, replace(install, requirements=build.requirements)
    progress = InstallProgress(f"torch {version}", venv=Path(session.virtualenv.location))
    line = ProgressLine(progress)
    with file_writes.open_stream(log_path) as log, line.ticking():
        log.write(f"# {' '.join(installer)} options: {' '.join(options) or '(none: the installer configuration)'}\n")
        if build is not None:
            log.write(f"# {channel}: {said}\n")
        pre = ["--pre"] if build is not None or Version(version).is_prerelease else []
        check = [
            *installer,
            "--dry-run",
            "--no-deps",
            f"torch=={version}",
            *options,
            *_progress_option(installer_version, uv),
        ]
        listed = False  # whether pip's index lists the version: only then can a constraint be what refuses it
        if build is not None and build.cached:
            check = None
        elif not uv:
            listing = session.run_install(
                "python", "-m", "pip", "index", "versions", "torch", *pre, *options, silent=True, success_codes=[0, 1]
            )
            log.write(f"# pip index versions torch\n{listing}\n")
            listed = index_has(version, listing or "")
            check = None if listed else [*check, "--ignore-installed"]
        wanted = [f"torch=={version}", "numpy", *install.requirements]
        wheels = None if uv else (build.wheels if build is not None else wheelhouse(version, install))
        if wheels is None:
            install_step = [*pre, *wanted, *options, *constraints, *_progress_option(installer_version, uv)]
            download = None
        else:
            wheels.mkdir(parents=True, exist_ok=True)
            download = ["python", "-m", "pip", "download", *pre, "-d", str(wheels), *wanted, *options, *constraints]
            download += _progress_option(installer_version, uv)
            download = None if build is not None and build.cached else download
            install_step = [*pre, "--no-index", "--find-links", str(wheels), *wanted, *constraints]
        steps = [("checking", check), ("downloading", download), ("installing", install_step)]
        for phase, command in steps:
            if command is None:
                continue
            log.write(f"# {phase}\n")
            log.flush()
            progress.phase = phase
            stream = StreamedCommand(log, progress, line)
            try:
                if phase == "installing":
                    session.install(*command, silent=False, stdout=stream.writer, stderr=subprocess.STDOUT)
                else:
                    session.run_install(*command, stdout=stream.writer, stderr=subprocess.STDOUT)
            except nox.command.CommandFailed:
                stream.close()
                log.flush()
                installer_output = log_path.read_text(errors="replace")
                reason = (
                    (listed and blocking_constraint(version, installer_output, pip_config, install.constraints))
                    or progress.reason
                    or f"the installer failed (see {log_path})"
                )
                line.close(f"failed: {reason}")
                return InstallResult(False, reason)
            stream.close()
    line.close("done")
    return InstallResult(True)


def _channel_build(version: str, install: TorchInstall, uv: bool) -> ChannelBuild | InstallResult | None:
    """A channel value's build (None for a pinned release); one it cannot resolve fails the install with the reason."""
    if channel_of(version) is None:
        return None
    try:
        return channel_build(version, install, lambda name: None if uv else wheelhouse(name, install))
    except ChannelError as error:
        return InstallResult(False, str(error))


def estimate_torch_install(
    python: str, version: str, install: TorchInstall, cached: list[str]
) -> InstallEstimate | None:
    """What installing torch==V as install_torch does will cost, asked of `python`'s pip (with
    pip's configuration, the version's index, requirements and constraints), the files named in
    `cached` (its wheelhouse's, see wheelhouse()) downloading nothing; None when pip cannot say.
    A channel value is resolved first, as its install will be; None when it cannot be."""
    build = _channel_build(version, install, uv=False)
    if isinstance(build, InstallResult):
        return None
    if build is not None:
        version, install = build.version, replace(install, requirements=build.requirements)
        cached = [*cached, *wheelhouse_files(build.wheels)]
    options = index_options(install, uv=False, pip_config_list="")
    with tempfile.TemporaryDirectory(prefix="torchmatrix-estimate-") as scratch:
        constraints = []
        if install.constraints:
            constraints_file = Path(scratch) / "constraints.txt"
            file_writes.write_text(constraints_file, "\n".join(install.constraints) + "\n")
            constraints = ["--constraint", str(constraints_file)]
        arguments = [f"torch=={version}", "numpy", *install.requirements, *options, *constraints]
        return estimate_install(python, arguments, cached, {**os.environ, **install.env})


def _progress_option(installer_version: str, uv: bool) -> list[str]:
    """pip's machine-readable download progress (pip >= 24.1); uv reports each download itself."""
    if uv:
        return []
    match = re.match(r"pip (\d+)\.(\d+)", installer_version)
    if match and (int(match[1]), int(match[2])) >= PIP_RAW_PROGRESS_SINCE:
        return ["--progress-bar", "raw"]
    return []
