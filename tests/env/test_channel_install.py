"""Installing a channel value from a local index laid out as PyTorch's nightly channel (PEP 503,
file://, dev versions with local labels): the build it resolves to, companions of the same date,
and a dated nightly reinstalled from the wheelhouse once the index no longer has it."""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from torchmatrix.env.channel_install import channel_build
from torchmatrix.env.torch_install import install_torch, wheelhouse
from torchmatrix.matrix.config import TorchInstall

TORCH = ["2.16.0.dev20261201+cpu", "2.16.0.dev20261202+cpu", "2.16.0.dev20261203+cpu"]
TORCHAO = ["0.16.0.dev20261201+cpu", "0.16.0.dev20261202+cpu"]
GONE = "file:///nonexistent/nightly/simple"


def local_index(root: Path, projects: dict[str, list[str]]) -> str:
    """A PEP 503 simple index at `root` listing empty wheels of these versions; its file:// URL."""
    for name, versions in projects.items():
        page = root / "simple" / name
        page.mkdir(parents=True)
        links = []
        for version in versions:
            wheel = f"{name}-{version}-cp311-cp311-linux_x86_64.whl"
            (root / wheel).write_bytes(b"")
            links.append(f'<a href="../../{wheel}">{wheel}</a>')
        (page / "index.html").write_text("<html><body>" + "<br/>".join(links) + "</body></html>")
    return (root / "simple").as_uri()


@pytest.fixture
def pip_sees_only_the_channel(monkeypatch, tmp_path):
    """This machine's pip configuration (find-links, extra indexes, a torch cap) left out."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCHMATRIX_WHEELHOUSE", str(tmp_path / "wheelhouse"))


class RecordingSession:
    """The nox session methods install_torch calls, recorded; no installer runs."""

    venv_backend = "virtualenv"

    def __init__(self):
        self.commands: list[list[str]] = []
        self.virtualenv = SimpleNamespace(location=tempfile.mkdtemp(prefix="fake-venv-"))

    def run_install(self, *args, **options):
        self.commands.append(list(args))
        return "pip 24.2 from /venv (python 3.11)" if args[-1] == "--version" else ""

    def install(self, *args, **options):
        self.commands.append(["python", "-m", "pip", "install", *args])


def test_nightly_resolves_on_the_channel_with_companions_of_its_date(tmp_path, pip_sees_only_the_channel):
    url = local_index(tmp_path / "index", {"torch": TORCH, "torchao": TORCHAO})
    install = TorchInstall(index_url=url, requirements=("torchao", "tmx-extra==1.0", "not-on-the-channel"))
    build = channel_build("nightly", install, lambda name: wheelhouse(name, install))
    assert build.version == "2.16.0.dev20261203+cpu" and not build.cached
    assert build.requirements == ("torchao==0.16.0.dev20261202+cpu", "tmx-extra==1.0", "not-on-the-channel")
    assert build.wheels.name.startswith("torch-nightly-20261203-")  # kept by date, found again by nightly-20261203
    install = replace(install, requirements=("torchao",))
    dated = channel_build("nightly-20261201", install, lambda name: wheelhouse(name, install))
    assert (dated.version, dated.requirements[0]) == (TORCH[0], "torchao==0.16.0.dev20261201+cpu")


def test_a_dated_nightly_reinstalls_from_the_wheelhouse_with_the_index_gone(tmp_path, pip_sees_only_the_channel):
    install = TorchInstall(index_url=GONE)
    kept = wheelhouse("nightly-20261202", install)
    kept.mkdir(parents=True)
    (kept / f"torch-{TORCH[1]}-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    session = RecordingSession()
    assert install_torch(session, "nightly-20261202", install, tmp_path / "install.log").ok
    assert not [c for c in session.commands if "download" in c or "index" in c], "nothing asked of the index"
    (installed,) = [c for c in session.commands if c[:4] == ["python", "-m", "pip", "install"]]
    assert installed[4:] == ["--pre", "--no-index", "--find-links", str(kept), f"torch=={TORCH[1]}", "numpy"]
    assert f"# nightly-20261202: torch {TORCH[1]}, from the wheelhouse {kept}" in (tmp_path / "install.log").read_text()


def test_a_channel_that_cannot_resolve_fails_the_install_in_one_line(tmp_path, pip_sees_only_the_channel):
    session = RecordingSession()
    result = install_torch(session, "nightly", TorchInstall(index_url=GONE), tmp_path / "install.log")
    assert not result.ok and "\n" not in result.reason
    assert result.reason.startswith(f"torch nightly: cannot list torch's releases on {GONE}")
    assert result.reason.endswith("or pin a dated nightly already in the wheelhouse")
    assert session.commands == [["python", "-m", "pip", "--version"]]
