"""The nox sessions as a user meets them: one error and exit 2 for a broken component, a progress
count that continues across torch versions, no "uv binary not found." noise."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from torchmatrix import sessions
from torchmatrix.env import version_venv
from torchmatrix.matrix.config import load_matrix
from torchmatrix.sessions import first_missing

from helpers.checkout import REPO, checkout_env
from helpers.fake_releases import fake_torch_wheel, offering, torch_site
from helpers.matrix_files import write_demo_project

UV_NOISE = "uv binary not found."


def nox(noxfile: Path, *args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(noxfile), *args],
        env=env or checkout_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def throwaway_noxfile(root: Path, body: str) -> Path:
    """A noxfile that imports this checkout's torchmatrix.sessions, then declares `body`."""
    path = root / "noxfile.py"
    header = f"import sys\nimport nox\nsys.path.insert(0, {str(REPO)!r})\nfrom torchmatrix import sessions\n"
    path.write_text(header + textwrap.dedent(body))
    return path


def test_each_matrix_session_knows_its_place_in_the_invocation(tmp_path):
    noxfile = throwaway_noxfile(
        tmp_path,
        """
        @nox.session(venv_backend="none")
        @nox.parametrize("torch", ["2.13.0", "2.14.1", "2.15.0"])
        def gpu_matrix(session, torch):
            print("part", torch, *sessions.invocation_part(session))

        @nox.session(venv_backend="none")
        def other(session):
            pass
        """,
    )
    every = nox(noxfile, "-s", "gpu_matrix", "other")
    assert every.returncode == 0, every.stderr
    parts = [line.split() for line in every.stdout.splitlines() if line.startswith("part ")]
    assert [(torch, part) for _, torch, _, part, _, _ in parts] == [
        ("2.13.0", "1/3"),
        ("2.14.1", "2/3"),
        ("2.15.0", "3/3"),
    ]
    assert len({since for *_, since in parts}) == 1, "elapsed counts from the invocation's start in every version"
    one = nox(noxfile, "-s", "gpu_matrix(torch='2.14.1')")
    assert "part 2.14.1 --progress-part 1/1" in one.stdout, one.stdout + one.stderr


def test_no_session_says_uv_binary_not_found(tmp_path):
    """nox logs the line when it probes for uv, as it creates a venv; the noxfile filters it.
    Without the filter the same nox prints it (unless this machine has uv)."""
    listed = nox(REPO / "noxfile.py", "-l")
    assert listed.returncode == 0 and "gpu_matrix" in listed.stdout
    assert UV_NOISE not in listed.stdout + listed.stderr
    noxfile = throwaway_noxfile(
        tmp_path,
        """
        if "--quiet-uv" in sys.argv:
            sessions.quiet_uv_probe()

        @nox.session
        def hello(session):
            session.run("python", "-c", "pass")
        """,
    )
    quiet = nox(noxfile, "--envdir", str(tmp_path / "quiet"), "--", "--quiet-uv")
    assert quiet.returncode == 0, quiet.stderr
    assert "Creating virtual environment" in quiet.stderr and UV_NOISE not in quiet.stderr
    installs_filter = "import logging, runpy; runpy.run_path('noxfile.py'); print(logging.getLogger('nox').filters)"
    filters = subprocess.run([sys.executable, "-c", installs_filter], cwd=REPO, capture_output=True, text=True)
    assert "UvProbeFilter" in filters.stdout, filters.stdout + filters.stderr
    if shutil.which("uv") or importlib.util.find_spec("uv"):
        pytest.skip("nox finds uv on this machine, so it never logs the line the filter drops")
    noisy = nox(noxfile, "--envdir", str(tmp_path / "noisy"))
    assert noisy.returncode == 0, noisy.stderr
    assert UV_NOISE in noisy.stderr, "nox no longer logs the line: drop UvProbeFilter"


@pytest.mark.slow
def test_a_broken_component_through_nox_is_one_error_exit_2_and_no_run_directory(tmp_path):
    """The session installs a fake release of this torch (tests/helpers/fake_releases.py) in seconds."""
    version = "2.97.0"
    offered = fake_torch_wheel(tmp_path / "releases", version, torch_site())
    project = write_demo_project(
        tmp_path / "project",
        torch=[version],
        axes={"world_size": [1]},
        components={"model": "userstack.stak:build_model"},
    )
    (project / "reports" / "earlier").mkdir(parents=True)
    (project / "reports" / "earlier" / "junit.xml").write_text("<testsuites/>")
    env = {
        **offering(offered.parent, checkout_env()),
        "TORCHMATRIX_WHEELHOUSE": str(tmp_path / "wheelhouse"),
        "TORCHMATRIX_CONFIG": str(project / "matrix.toml"),
        "TORCHMATRIX_RUN_ID": "broken",
    }
    done = nox(REPO / "noxfile.py", "--envdir", str(tmp_path / "nox"), "-s", "gpu_matrix", env=env, timeout=900)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-3000:]
    errors = [line for line in output.splitlines() if "error" in line.lower() or "failed" in line.lower()]
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"torchmatrix: error: {project / 'matrix.toml'}: components.model: no module"), errors
    assert "'userstack.stak:build_model'" in errors[0]
    assert "holds no JUnit reports" not in output and "Running session report" not in output
    assert not (project / "reports" / "broken").exists(), "the session removes the run directory it created"
    assert (project / "reports" / "earlier" / "junit.xml").exists(), "another run's results stay"


def test_a_failed_session_removes_only_the_directories_it_created(tmp_path):
    reports = tmp_path / "reports"
    logs = reports / "run" / "torch-2.13.0" / "logs"
    assert first_missing(logs, stop=reports) == reports / "run"
    (reports / "run" / "torch-2.14.1").mkdir(parents=True)
    assert first_missing(logs, stop=reports) == reports / "run" / "torch-2.13.0", "another version's results stay"
    logs.mkdir(parents=True)
    assert first_missing(logs, stop=reports) is None, "a directory an earlier attempt made stays"


def test_a_users_two_line_noxfile_declares_the_sessions_over_its_own_matrix(tmp_path):
    write_demo_project(tmp_path, torch=["2.13.0", "2.14.1", "system"], axes={"world_size": [1]})
    (tmp_path / "noxfile.py").write_text(
        "from torchmatrix.nox_sessions import *  # noqa: F403\n\nMATRIX_LOCK = lock_matrix_sessions()\n"
    )
    listed = nox(tmp_path / "noxfile.py", "-l", env={**checkout_env(), "PYTHONPATH": ""})
    assert listed.returncode == 0, listed.stderr
    sessions = [line.split()[1] for line in listed.stdout.splitlines() if line.startswith("* ")]
    versions = load_matrix(tmp_path / "matrix.toml").versions
    expected = [f"gpu_matrix(torch='{v}')" for v in versions if v != "system"]
    assert sessions == [*expected, "report", "list", "compare", "cli", "merge", "sensitivity", "bisect"]


def test_the_later_installs_are_summed_at_this_invocations_pace_and_one_unknown_makes_all_unknown(capsys, monkeypatch):
    """What gpu_matrix passes as --progress-installs-after: each later version's estimate at the pace
    the measured installs set, a line each; a version pip could not estimate makes the sum unknown,
    and a venv nox reuses (absent from the estimates) costs nothing."""
    from torchmatrix import sessions
    from torchmatrix.env.install_estimate import InstallEstimate, InstallPace

    small, big = InstallEstimate(0, 230_000_000), InstallEstimate(2_900_000_000, 2_900_000_000)
    pace = InstallPace()
    pace.record(small, 2 * small.seconds)
    monkeypatch.setattr(sessions, "INSTALL_PACE", pace)
    estimates = {"2.13.0": small, "2.14.1": big, "2.15.0": None}
    assert sessions.installs_after(estimates, ["2.14.1"]) == f"{pace.seconds(big):.0f}"
    assert pace.seconds(big) > big.seconds, "at the pace the measured install set, not the priors'"
    assert "torch 2.14.1, to install later: 2.9 GB to download" in capsys.readouterr().err
    assert sessions.installs_after(estimates, ["2.14.1", "2.15.0"]) == "unknown"
    assert "torch 2.15.0's install is not estimated" in capsys.readouterr().err
    assert sessions.installs_after(estimates, ["2.16.0"]) == "0", "a reused venv installs nothing"
    assert sessions.installs_after(estimates, []) == "0"


class RecordingSession:
    """What a nox session body asks for: its installs and the commands it runs, none carried out."""

    def __init__(self, venv: Path, posargs: list[str], *, kept: bool = False):
        venv.mkdir(parents=True, exist_ok=True)  # nox made it before the session's body runs
        self.virtualenv = SimpleNamespace(location=str(venv), _reused=kept, reuse_existing=kept, create=lambda: True)
        self.posargs = posargs
        self.installed: list[str] = []
        self.ran: list[tuple[str, ...]] = []

    def install(self, *packages: str) -> None:
        self.installed.extend(packages)

    def run_install(self, *command: str, **options) -> str:
        return ""  # installs run (not `nox -R`)

    def run(self, *command: str, **options) -> None:
        self.ran.append(command)


def test_the_report_session_has_nox_so_cross_read_finds_the_gpu_matrix_venvs(tmp_path):
    """cross-read names a version's interpreter by nox's own venv naming; a report venv without nox
    found none and checked no read under `nox -s report`."""
    matrix = load_matrix(write_demo_project(tmp_path / "project", axes={"world_size": [1]}) / "matrix.toml")
    session = RecordingSession(tmp_path / "project" / ".nox" / "report", [str(tmp_path / "run")])
    sessions.report(session, matrix)
    assert "nox" in session.installed
    (read,) = [command for command in session.ran if "cross-read" in command]
    assert read[read.index("--envdir") + 1] == str(tmp_path / "project" / ".nox")


def test_the_report_venv_is_kept_while_its_stamp_says_it_holds_this_torchmatrix_and_nox(tmp_path):
    """Every `nox -s gpu_matrix` ends in the report session: a venv nox kept installs nothing again
    (pip took seconds of each run for nothing), one whose stamp names another torchmatrix is made anew."""
    matrix = load_matrix(write_demo_project(tmp_path / "project", axes={"world_size": [1]}) / "matrix.toml")
    venv = tmp_path / "project" / ".nox" / "report"
    first = RecordingSession(venv, [str(tmp_path / "run")])
    sessions.report(first, matrix)
    assert "nox" in first.installed and (venv / version_venv.STAMP_NAME).is_file()

    kept = RecordingSession(venv, [str(tmp_path / "run")], kept=True)
    sessions.report(kept, matrix)
    assert kept.installed == [] and any("cross-read" in command for command in kept.ran)
    assert kept.virtualenv.reuse_existing, "a venv that holds what the report needs is not made anew"

    stamp = json.loads((venv / version_venv.STAMP_NAME).read_text())
    (venv / version_venv.STAMP_NAME).write_text(json.dumps({"report": ["torchmatrix==0.1"]}))
    renewed = RecordingSession(venv, [str(tmp_path / "run")], kept=True)
    sessions.report(renewed, matrix)
    assert "nox" in renewed.installed and renewed.virtualenv.reuse_existing is False, "made anew, then installed"
    assert json.loads((venv / version_venv.STAMP_NAME).read_text()) == stamp


@pytest.mark.slow
def test_a_kept_venv_installs_nothing_again_and_one_whose_stamp_differs_is_made_anew(tmp_path):
    """Three `nox -s gpu_matrix` runs on a fake release of this torch (tests/helpers/fake_releases.py), whose
    broken component ends each run at its check, in the venv, right after the installs."""
    version = "2.97.0"
    offered = fake_torch_wheel(tmp_path / "releases", version, torch_site())
    project = write_demo_project(
        tmp_path / "project", torch=[version], axes={"world_size": [1]}, components={"model": "userstack.stak:build"}
    )
    env = {
        **offering(offered.parent, checkout_env()),
        "TORCHMATRIX_WHEELHOUSE": str(tmp_path / "wheelhouse"),
        "TORCHMATRIX_CONFIG": str(project / "matrix.toml"),
    }
    envdir = tmp_path / "nox"
    reusing = f"torchmatrix: torch {version}: reusing its venv, installed as matrix.toml says"

    def gpu_matrix(run_id: str) -> str:
        done = nox(
            REPO / "noxfile.py",
            "--envdir",
            str(envdir),
            "-s",
            "gpu_matrix",
            env={**env, "TORCHMATRIX_RUN_ID": run_id},
            timeout=900,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 2 and "components.model: no module" in output, output[-3000:]
        return output

    first = gpu_matrix("first")
    venv = version_venv.gpu_matrix_python(envdir, version).parent.parent  # nox's name for it
    assert reusing not in first and (venv / version_venv.STAMP_NAME).exists(), first[-3000:]
    (venv / "planted").write_text("left by the first run")

    second = gpu_matrix("second")
    assert reusing in second, second[-3000:]
    assert f"torch-{version}" not in second.split(reusing)[1], "nothing downloads or installs torch again"
    assert (venv / "planted").exists(), "the venv is the first run's"

    stamp = json.loads((venv / version_venv.STAMP_NAME).read_text())
    (venv / version_venv.STAMP_NAME).write_text(json.dumps({**stamp, "requires": {"model": ["torchao"]}}))
    third = gpu_matrix("third")
    assert reusing not in third, third[-3000:]
    assert not (venv / "planted").exists(), "a venv installed for another matrix is made anew"
    assert json.loads((venv / version_venv.STAMP_NAME).read_text()) == stamp
