"""Installing a torch version: the progress line folded from pip's and uv's output, the index
settings uv is given, the availability check, and a missing version through nox end to end."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from junitparser import JUnitXml

from torchmatrix.install_progress import InstallProgress, ProgressLine
from torchmatrix.torch_install import index_has, pip_index_options

from conftest import REPO, checkout_env, write_matrix

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
    assert progress.line(now=0).startswith("torch 2.7.1: installing 3 packages | 921 MB downloaded (2 files")


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
    ],
    ids=["pip", "uv"],
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


@pytest.mark.slow
def test_a_version_the_index_lacks_fails_fast_with_pips_reason(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "suites").mkdir()
    (project / "suites" / "test_demo.py").write_text("def test_x(cell):\n    pass\n")
    write_matrix(project, torch=["9.9.9"], axes={"world_size": [1, 2]}, suites={"demo": {}})
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
    reason = "Could not find a version that satisfies the requirement torch==9.9.9"
    assert "torch 9.9.9: checking | 0:0" in done.stderr, done.stderr[-3000:]
    assert f"did not install: ERROR: {reason}" in done.stderr
    log = (project / "reports" / "missing" / "torch-9.9.9" / "logs" / "install.log").read_text()
    assert "# installing" not in log, "nothing is downloaded for a version the index lacks"
    cases = [case for suite in JUnitXml.fromfile(str(project / "reports" / "missing" / "junit.xml")) for case in suite]
    assert len(cases) == 2 and all(case.is_error and reason in case.result[0].text for case in cases)


@pytest.mark.slow
def test_a_second_venv_for_a_version_seen_before_downloads_nothing(tmp_path):
    """pip's downloads land in the wheelhouse; a fresh venv for the same version installs from it."""
    from torchmatrix.devices import probe

    version = probe().base_version
    project = tmp_path / "project"
    (project / "suites").mkdir(parents=True)
    (project / "suites" / "test_demo.py").write_text("def test_x(cell):\n    pass\n")
    write_matrix(project, torch=[version], axes={"world_size": [1]}, suites={"demo": {}})
    wheels = tmp_path / "wheelhouse"
    logs = []
    for attempt in ("cold", "warm"):
        env = {
            **checkout_env(),
            "TORCHMATRIX_CONFIG": str(project / "matrix.toml"),
            "TORCHMATRIX_RUN_ID": attempt,
            "TORCHMATRIX_WHEELHOUSE": str(wheels),
        }
        done = subprocess.run(
            [sys.executable, "-m", "nox", "-f", str(REPO / "noxfile.py"), "--envdir", str(tmp_path / attempt)]
            + ["-s", f"gpu_matrix(torch='{version}')"],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        logs.append((project / "reports" / attempt / f"torch-{version}" / "logs" / "install.log").read_text())
    torch_wheel = f"torch-{version}"
    assert any(path.name.startswith(torch_wheel) for path in (wheels / f"torch-{version}-default").iterdir())
    cold, warm = logs
    assert "File was already downloaded" not in cold.split("# installing")[0].split(torch_wheel)[0]
    downloaded_again = [line for line in warm.splitlines() if line.strip().startswith(("Downloading", "Saved"))]
    assert downloaded_again == [], f"the warm install fetched files again: {downloaded_again}"
    assert f"File was already downloaded {wheels}" in warm
    assert "--no-index" in warm or "Looking in links" in warm
