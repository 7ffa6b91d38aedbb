"""Installing a torch version: the progress line folded from pip's and uv's output, the index
settings uv is given, the availability check, and a missing version through nox end to end."""

from __future__ import annotations

import functools
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import pytest
from junitparser import JUnitXml

from torchmatrix import sessions
from torchmatrix.env import torch_install, version_venv
from torchmatrix.env.install_progress import InstallProgress, ProgressLine
from torchmatrix.env.torch_install import index_has, install_torch, pip_index_options
from torchmatrix.matrix.config import TorchInstall, load_matrix

from helpers.checkout import REPO, checkout_env
from helpers.fake_releases import fake_torch_wheel, offering, torch_requirements, torch_site
from helpers.matrix_files import write_demo_project

PIP_TRANSCRIPT = """\
Looking in indexes: https://pypi.org/simple
Collecting torch==2.7.1
  Downloading torch-2.7.1-cp311-cp311-manylinux_2_28_x86_64.whl.metadata (29 kB)
  Downloading torch-2.7.1-cp311-cp311-manylinux_2_28_x86_64.whl (821.2 MB)
Progress 0 of 821200000
Progress 400000000 of 821200000
"""
PIP_REST = """\
Progress 821200000 of 821200000
Collecting filelock (from torch==2.7.1)
  Using cached filelock-4.2.11-py3-none-any.whl (22 kB)
Collecting nvidia-cudnn-cu12==9.5.1.17 (from torch==2.7.1)
  Downloading nvidia_cudnn_cu12-9.5.1.17-py3-none-manylinux_2_28_x86_64.whl (571.0 MB)
Progress 100000000 of 571000000
"""
PIP_INSTALL = "Installing collected packages: filelock, nvidia-cudnn-cu12, torch\n"


def fed(text: str, progress: InstallProgress | None = None) -> InstallProgress:
    progress = progress or InstallProgress("torch 2.7.1", started=0.0)
    for line in text.splitlines(keepends=True):
        progress.feed(line)
    return progress


def test_pip_downloads_show_the_file_and_megabytes_done():
    progress = fed(PIP_TRANSCRIPT)
    assert progress.line(now=75) == (
        "torch 2.7.1: downloading torch-2.7.1 400/821 MB | 400 MB downloaded (0 files, 0 from cache) | 1:15 elapsed"
    )
    fed(PIP_REST, progress)
    assert "downloading nvidia_cudnn_cu12-9.5.1.17 100/571 MB" in progress.line(now=0)
    assert "921 MB downloaded (1 files, 1 from cache)" in progress.line(now=0)
    fed(PIP_INSTALL, progress)
    assert progress.line(now=0).startswith(
        "torch 2.7.1: installing 3 packages (filelock, nvidia-cudnn-cu12, torch) | 921 MB downloaded (2 files"
    )


def test_the_silent_unpacking_shows_what_it_installs_and_how_much_it_wrote(tmp_path):
    """pip prints nothing for minutes while it unpacks torch; the line names the packages and grows
    with the bytes written into the venv (it stayed `installing 29 packages 0/0 MB` before)."""
    progress = InstallProgress("torch 2.15.0", started=0.0, venv=tmp_path)
    fed("Progress 1000 of 300000\n", progress)
    fed("Installing collected packages: " + ", ".join(f"p{i}" for i in range(29)) + "\n", progress)
    assert progress.line(now=10).startswith(
        "torch 2.15.0: installing 29 packages (p0, p1, p2, +26 more) | 0 MB unpacked"
    )
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libtorch_cpu.so").write_bytes(b"\0" * 3_000_000)
    assert "| 3 MB unpacked into the venv |" in progress.line(now=20)
    assert "0/0 MB" not in progress.line(now=20)


def test_uv_downloads_count_when_each_completes():
    progress = fed(
        "Resolved 24 packages in 1.20s\n"
        "Downloading torch (783.2MiB)\n"
        "Downloading nvidia-cudnn-cu12 (544.5MiB)\n"
        " Downloaded nvidia-cudnn-cu12\n"
    )
    assert "downloading nvidia-cudnn-cu12" not in progress.line(now=0)
    fed(" Downloaded torch\nPrepared 24 packages in 2m 03s\n", progress)
    assert progress.phase == "installing" and progress.downloads == 2


@pytest.mark.parametrize(
    "output, reason",
    [
        (
            "ERROR: Could not find a version that satisfies the requirement torch==9.9.9 (from versions: 2.7.1)\n"
            "ERROR: No matching distribution found for torch==9.9.9\n",
            "ERROR: Could not find a version that satisfies the requirement torch==9.9.9 (from versions: 2.7.1)",
        ),
        (
            "  × No solution found when resolving dependencies:\n"
            "  ╰─▶ Because there is no version of torch==9.9.9 and you require torch==9.9.9, we can conclude that your requirements are unsatisfiable.\n",
            "Because there is no version of torch==9.9.9 and you require torch==9.9.9, we can conclude that your requirements are unsatisfiable.",
        ),
        (
            "ERROR: Ignored the following versions that require a different python version: 1.21.2 Requires-Python >=3.7,<3.11\n"
            "ERROR: Could not find a version that satisfies the requirement nosuch==1 (from torch) (from versions: none)\n",
            "ERROR: Could not find a version that satisfies the requirement nosuch==1 (from torch) (from versions: none)",
        ),
    ],
    ids=["pip", "uv", "pip-after-its-note-on-ignored-versions"],
)
def test_the_installers_first_reason_line_is_kept(output, reason):
    assert fed(output).reason == reason


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_tty_gets_one_line_rewritten_in_place(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    stream = Terminal()
    progress = fed(PIP_TRANSCRIPT)
    shown = ProgressLine(progress, stream)
    shown.update(now=1.0)
    shown.update(now=1.1)
    shown.update(now=1.5)
    shown.close("done")
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("| done\x1b[K\n")
    assert text.count("\r") == 3, "updated at most every 0.2 s, then the final state"


def test_a_ci_log_gets_periodic_lines_and_one_per_phase():
    stream = io.StringIO()
    progress = fed(PIP_TRANSCRIPT)
    shown = ProgressLine(progress, stream, interval=15)
    for now in (0, 5, 10, 16, 20):
        shown.update(now=now)
    fed(PIP_INSTALL, progress)
    shown.update(now=21)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in stream.getvalue()
    assert lines[0].startswith("torch 2.7.1: downloading") and lines[2].startswith("torch 2.7.1: installing")


def test_uv_gets_the_index_settings_pip_reads(tmp_path):
    config = tmp_path / "pip.conf"
    config.write_text(
        "[global]\nindex-url = https://mirror.example/simple\nextra-index-url = https://a.example/simple https://b.example/simple\n"
    )
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        env={**os.environ, "PIP_CONFIG_FILE": str(config), "PIP_FIND_LINKS": "/wheels"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    options = pip_index_options(listed)
    assert options == [
        "--index-strategy",
        "unsafe-best-match",
        "--index-url",
        "https://mirror.example/simple",
        "--extra-index-url",
        "https://a.example/simple",
        "--extra-index-url",
        "https://b.example/simple",
        "--find-links",
        "/wheels",
    ]


def test_the_index_listing_accepts_local_labels_and_nightlies():
    listing = "torch (2.15.0)\nAvailable versions: 2.15.0, 2.13.0+cpu, 2.9.0.dev20250801+cpu\n"
    assert index_has("2.13.0", listing) and index_has("2.9.0.dev20250801", listing)
    assert not index_has("9.9.9", listing) and not index_has("2.14.1", listing)
    assert not index_has("2.13.0", "ERROR: No matching distribution found for torch")


# An installer that says what it does, then goes silent, as pip does while it unpacks torch.
FAKE_INSTALLER = """
import os, sys, time
if "download" in sys.argv:
    print("  Downloading torch-2.13.0-cp311-none-any.whl (1.0 MB)")
    print("Progress 1000000 of 1000000")
elif "install" in sys.argv:
    print("Installing collected packages: numpy, torch", flush=True)
    time.sleep(float(os.environ["FAKE_SILENT_S"]))
"""


class FakeSession:
    """The parts of a nox session that installing torch uses: each command is recorded with the
    session's env, and installer commands run FAKE_INSTALLER into the stream they are given."""

    def __init__(self, backend: str = "virtualenv", silent_s: float = 0.0):
        self.venv_backend = backend
        self.silent_s = silent_s
        self.env: dict[str, str] = {}
        self.posargs: list[str] = []
        self.commands: list[tuple[list[str], dict[str, str]]] = []
        self.virtualenv = SimpleNamespace(location=tempfile.mkdtemp(prefix="fake-venv-"))
        self._runner = SimpleNamespace(  # what sessions.invocation_part reads: nox queued nothing after this one
            name="gpu_matrix(torch='2.13.0')", manifest=SimpleNamespace(list_all_sessions=lambda: [])
        )

    def run_install(self, *args, silent=False, log=True, success_codes=None, stdout=None, stderr=None):
        self.commands.append((list(args), dict(self.env)))
        if args[-1] == "--version":
            return "Python 3.11.7" if self.venv_backend == "uv" else "pip 24.2 from /venv (python 3.11)"
        if "index" in args:
            return "torch (2.13.0)\nAvailable versions: 2.13.0\n"
        subprocess.run(
            [sys.executable, "-c", FAKE_INSTALLER, *args],
            env={**os.environ, "FAKE_SILENT_S": str(self.silent_s)},
            stdout=stdout,
            stderr=stderr,
            check=True,
        )
        return None

    def install(self, *args, silent=False, stdout=None, stderr=None):
        installer = ["uv", "pip", "install"] if self.venv_backend == "uv" else ["python", "-m", "pip", "install"]
        return self.run_install(*installer, *args, stdout=stdout, stderr=stderr)

    def run(self, *args, **kwargs):
        self.commands.append((list(args), dict(self.env)))

    def notify(self, *args):
        pass

    def error(self, message):
        raise AssertionError(message)

    def command(self, *words: str) -> tuple[list[str], dict[str, str]]:
        """The one recorded command that starts with `words`."""
        (found,) = [(argv, env) for argv, env in self.commands if argv[: len(words)] == list(words)]
        return found


def test_a_silent_installer_still_gets_periodic_progress_lines(tmp_path, monkeypatch):
    """pip prints nothing for minutes while it unpacks torch; the CI log must keep getting lines."""
    monkeypatch.setenv("TORCHMATRIX_WHEELHOUSE", "off")
    log = io.StringIO()
    monkeypatch.setattr(torch_install, "ProgressLine", functools.partial(ProgressLine, stream=log, interval=0.3))
    result = install_torch(FakeSession(silent_s=2.2), "2.13.0", TorchInstall(), tmp_path / "install.log")
    assert result.ok
    lines = log.getvalue().splitlines()
    installing = [line for line in lines[:-1] if line.startswith("torch 2.13.0: installing 2 packages")]
    assert len(installing) >= 4, lines  # the phase change, then one every 0.3 s of silence
    minutes, seconds = installing[-1].removesuffix(" elapsed").rpartition("| ")[2].split(":")
    assert int(minutes) * 60 + int(seconds) >= 2, lines  # the silence lasted 2.2 s; a loaded machine adds to it
    assert lines[-1].endswith("| done")


def test_a_tty_line_keeps_counting_seconds_while_the_installer_is_silent(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    stream = Terminal()
    shown = ProgressLine(InstallProgress("torch 2.13.0", phase="installing"), stream)
    with shown.ticking():
        time.sleep(2.6)
    shown.close("done")
    assert "| 0:01 elapsed" in stream.getvalue() and "| 0:02 elapsed\x1b[K" in stream.getvalue()


VERSION_INSTALL = """
[torch]
versions = ["2.13.0"]

[torch.install."2.13.0"]
index_url = "file:///srv/nightly/simple"
requirements = ["tmx-extra==1.0"]
constraints = ["numpy<3"]
env = { TMX_FLAG = "on" }

[axes]
world_size = [1]

[suites.demo]
path = "suites/test_demo.py"
"""


def test_a_versions_install_table_reaches_pip(tmp_path, monkeypatch):
    """index_url, requirements, constraints and env of `[torch.install."V"]`, in the commands nox runs."""
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "test_demo.py").write_text("def test_x(cell):\n    pass\n")
    (tmp_path / "matrix.toml").write_text(VERSION_INSTALL)
    monkeypatch.setenv("TORCHMATRIX_WHEELHOUSE", str(tmp_path / "wheels"))
    session = FakeSession()
    sessions.gpu_matrix(session, load_matrix(tmp_path / "matrix.toml"), "2.13.0", "run-1")
    logs = tmp_path / "reports" / "run-1" / "torch-2.13.0" / "logs"
    wheels = str(next((tmp_path / "wheels").iterdir()))
    constraint = ["--constraint", str(logs / "constraints.txt")]
    assert (logs / "constraints.txt").read_text() == "numpy<3\n"
    index = ["--index-url", "file:///srv/nightly/simple"]
    listing, _ = session.command("python", "-m", "pip", "index", "versions", "torch")
    assert listing[6:] == index
    download, env = session.command("python", "-m", "pip", "download")
    wanted = ["torch==2.13.0", "numpy", "tmx-extra==1.0"]
    assert download[4:] == ["-d", wheels, *wanted, *index, *constraint, "--progress-bar", "raw"]
    install, install_env = session.command("python", "-m", "pip", "install", "--no-index")
    assert install[4:] == ["--no-index", "--find-links", wheels, *wanted, *constraint]
    assert env["TMX_FLAG"] == install_env["TMX_FLAG"] == "on"
    _, run_env = session.command("python", "-m", "torchmatrix", "run")
    assert run_env["TMX_FLAG"] == "on"


def test_uv_gets_an_index_a_versions_env_sets(tmp_path, monkeypatch):
    """PIP_INDEX_URL in `[torch.install."V"].env` is read by pip in the venv; uv gets it as --index-url."""
    install = TorchInstall(env={"PIP_INDEX_URL": "file:///from/version/env/simple"})
    session = FakeSession(backend="uv")
    session.env.update(install.env)
    assert install_torch(session, "2.13.0", install, tmp_path / "install.log").ok
    argv, _ = session.command("uv", "pip", "install", "torch==2.13.0", "numpy")
    at = argv.index("--index-url")
    assert argv[at + 1] == "file:///from/version/env/simple" and argv.count("--index-url") == 1


def pips_own_reason(requirement: str) -> str:
    """The first ERROR line pip itself prints for the requirement, under this machine's pip configuration
    ("Could not find a version …" on a plain index, "Cannot install … conflicting dependencies" under a cap)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", requirement], capture_output=True, text=True
    )
    errors = [line.removeprefix("ERROR: ") for line in done.stderr.splitlines() if line.startswith("ERROR: ")]
    assert done.returncode != 0 and errors, done.stderr
    return errors[0]


@pytest.mark.slow
def test_a_version_the_index_lacks_fails_fast_with_pips_reason(tmp_path):
    project = write_demo_project(tmp_path / "project", torch=["9.9.9"], axes={"world_size": [1, 2]})
    env = {**checkout_env(), "TORCHMATRIX_CONFIG": str(project / "matrix.toml"), "TORCHMATRIX_RUN_ID": "missing"}
    done = subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(REPO / "noxfile.py"), "--envdir", str(tmp_path / "nox")]
        + ["-s", "gpu_matrix(torch='9.9.9')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode != 0
    reason = pips_own_reason("torch==9.9.9")
    assert "torch 9.9.9: checking | 0:0" in done.stderr, done.stderr[-3000:]
    assert f"did not install: ERROR: {reason}" in done.stderr
    log = (project / "reports" / "missing" / "torch-9.9.9" / "logs" / "install.log").read_text()
    assert "# installing" not in log, "nothing is downloaded for a version the index lacks"
    cases = [case for suite in JUnitXml.fromfile(str(project / "reports" / "missing" / "junit.xml")) for case in suite]
    assert len(cases) == 2 and all(case.is_error and reason in case.result[0].text for case in cases)


@pytest.mark.slow
def test_a_second_venv_for_a_version_seen_before_downloads_nothing(tmp_path):
    """pip's downloads land in the wheelhouse; a fresh venv for the same version installs from it
    (`--install-only`: nox installs and runs no cell, as a CI job that builds its venvs does). The release is a fake one with torch's own dependencies (tests/helpers/fake_releases.py): the
    same downloads and installs as the real wheel, without unpacking torch into two venvs."""
    version = "2.97.0"
    offered = fake_torch_wheel(tmp_path / "releases", version, torch_site(), torch_requirements())
    project = write_demo_project(tmp_path / "project", torch=[version], axes={"world_size": [1]})
    wheels = tmp_path / "wheelhouse"
    logs = []
    for attempt in ("cold", "warm"):
        env = {
            **offering(offered.parent, checkout_env()),
            "TORCHMATRIX_CONFIG": str(project / "matrix.toml"),
            "TORCHMATRIX_RUN_ID": attempt,
            "TORCHMATRIX_WHEELHOUSE": str(wheels),
        }
        done = subprocess.run(
            [sys.executable, "-m", "nox", "-f", str(REPO / "noxfile.py"), "--envdir", str(tmp_path / attempt)]
            + ["-s", f"gpu_matrix(torch='{version}')", "--install-only"],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Skipping python run, as --install-only is set" in done.stderr, done.stderr[-3000:]
        logs.append((project / "reports" / attempt / f"torch-{version}" / "logs" / "install.log").read_text())
    torch_wheel = f"torch-{version}"
    kept = {path.name for path in (wheels / f"torch-{version}-default").iterdir()}
    assert any(name.startswith(torch_wheel) for name in kept)
    needed = {
        re.split(r"[<>=!~;\[ ]", requirement)[0].lower().replace("-", "_") for requirement in torch_requirements()
    }
    assert needed and all(any(name.lower().startswith(f"{package}-") for name in kept) for package in needed), kept
    cold, warm = logs
    assert "File was already downloaded" not in cold.split("# installing")[0].split(torch_wheel)[0]
    downloaded_again = [line for line in warm.splitlines() if line.strip().startswith(("Downloading", "Saved"))]
    assert downloaded_again == [], f"the warm install fetched files again: {downloaded_again}"
    assert f"File was already downloaded {wheels}" in warm
    assert "--no-index" in warm or "Looking in links" in warm


def test_bisect_reuses_the_venv_the_matrix_session_installed(tmp_path, monkeypatch):
    """gpu_matrix writes the reuse stamp bisect reads: a bisect step after `nox -s gpu_matrix` installs nothing."""
    matrix = load_matrix(
        write_demo_project(tmp_path / "project", torch=["2.13.0"], axes={"world_size": [1]}) / "matrix.toml"
    )
    monkeypatch.setenv("TORCHMATRIX_WHEELHOUSE", str(tmp_path / "wheels"))
    envdir = tmp_path / "nox"
    venv = version_venv.VersionVenv(envdir, "2.13.0", {})
    venv.virtualenv.create()  # where nox puts gpu_matrix(torch='2.13.0')'s venv
    session = FakeSession()
    session.virtualenv = SimpleNamespace(location=str(venv.location))
    sessions.gpu_matrix(session, matrix, "2.13.0", "run-1")
    installs = []

    def install_again(*args):
        installs.append(args)
        return torch_install.InstallResult(False, "installed again")

    monkeypatch.setattr(version_venv, "install_torch", install_again)
    _, installed, reused = version_venv.prepare_venv(matrix, envdir, "2.13.0", tmp_path / "logs")
    assert reused and installed.ok and not installs
    version_venv.clear_stamp(venv.location)  # a session that writes no stamp, as before: bisect installs again
    _, installed, reused = version_venv.prepare_venv(matrix, envdir, "2.13.0", tmp_path / "logs")
    assert not reused and installs


def test_torchmatrix_that_does_not_install_into_a_venv_is_one_line_naming_the_venv(tmp_path, monkeypatch):
    """bisect's venvs get this torchmatrix after torch: when pip cannot install it, no torch version
    is to blame, so it is a one-line error (exit 2), not nox's CommandFailed traceback."""
    matrix = load_matrix(
        write_demo_project(tmp_path / "project", torch=["2.13.0"], axes={"world_size": [1]}) / "matrix.toml"
    )
    monkeypatch.setattr(version_venv, "install_torch", lambda *args: torch_install.InstallResult(True))
    missing = tmp_path / "no-such-checkout"
    monkeypatch.setattr(version_venv, "install_arguments", lambda: ["-e", str(missing)])
    with pytest.raises(version_venv.SelfInstallError) as raised:
        version_venv.prepare_venv(matrix, tmp_path / "nox", "2.13.0", tmp_path / "logs")
    message = str(raised.value)
    assert "\n" not in message and raised.value.exit_code == 2
    assert "torch 2.13.0's venv" in message and str(missing) in message and "failed (Returned code" in message
